"""Bus bandwidth as nccl-tests define it, and the rows of lesson 06's ring-vs-dist sweep."""

from __future__ import annotations

import pytest

from ddp_tutorial.comm.busbw import KB, MB, bus_factor, ring_alpha_beta, sweep, sweep_report


def test_bus_factor_is_2_n_minus_1_over_n():
    assert [bus_factor(n) for n in (1, 2, 4, 8)] == [0.0, 1.0, 1.5, 1.75]


@pytest.mark.timeout(120)
def test_sweep_rows_follow_the_definitions():
    sizes = [4 * KB, 64 * KB]
    rows = sweep(2, sizes, repeat=1, max_calls=2)
    assert [r["bytes"] for r in rows] == sizes and all(r["world_size"] == 2 for r in rows)
    for r in rows:
        for impl in ("ring", "dist"):
            assert r[f"{impl}_s"] > 0
            assert r[f"{impl}_busbw"] == pytest.approx(r["bytes"] / r[f"{impl}_s"] / 1e9 * bus_factor(2))
        assert r["ring/dist"] == pytest.approx(r["ring_busbw"] / r["dist_busbw"])


def _row(n: int, nbytes: int, ring_s: float, dist_s: float) -> dict:
    algbw = {impl: nbytes / s / 1e9 for impl, s in (("ring", ring_s), ("dist", dist_s))}
    return {"world_size": n, "bytes": nbytes, "ring_s": ring_s, "dist_s": dist_s,
            "ring_busbw": algbw["ring"] * bus_factor(n), "dist_busbw": algbw["dist"] * bus_factor(n),
            "ring/dist": dist_s / ring_s}


def test_sweep_report_prints_rows_growth_and_the_copy_gap():
    rows = [_row(2, s, t, t / 2) for s, t in ((4 * KB, 1e-3), (64 * KB, 2e-3), (MB, 4e-3), (16 * MB, 32e-3))]
    lines = sweep_report(rows, copy_gbps=8.0).splitlines()
    assert lines[1].split() == ["2", "4096", "1000", "500", "0.004", "0.008", "0.50"]
    assert lines[6] == ("2 ranks, 16x the bytes takes  4 KB -> 64 KB: ring x2.0, dist x2.0;  "
                        "1 MB -> 16 MB: ring x8.0, dist x8.0 as long")
    dist_busbw = 16 * MB / 16e-3 / 1e9
    assert lines[-1] == (f"2 ranks at 16 MB: gloo on loopback reaches {dist_busbw:.2f} GB/s busbw, "
                         f"{8.0 / dist_busbw:.1f}x below a memory copy")


def test_ring_alpha_beta_recovers_a_known_cost_per_step():
    alpha, beta = 1e-3, 1 / 2e9  # 1 ms a step, 2 GB/s
    n = 4
    rows = [_row(n, s, 2 * (n - 1) * (alpha + s / n * beta), 1.0) for s in (4 * KB, 64 * KB, MB, 16 * MB)]
    got_alpha, got_beta = ring_alpha_beta(rows + [_row(2, KB, 9.0, 1.0)], n)  # other world sizes are ignored
    assert got_alpha == pytest.approx(alpha, rel=1e-9) and got_beta == pytest.approx(beta, rel=1e-9)
