"""Bus bandwidth as nccl-tests define it, and the rows of lesson 05's ring-vs-dist sweep."""

from __future__ import annotations

import pytest

from ddp_tutorial.comm.busbw import KB, bus_factor, sweep


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
