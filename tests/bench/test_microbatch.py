"""``bench pipeline --schedules`` (``ddp_tutorial.bench.microbatch``): every schedule held to its own ideal.

The runs are replaced by their ideal timelines, so the test is quick and knows the answer: a run
that keeps to its ideal clock has a gap of 0, and the zero-bubble schedules' ideal sits below
interleaved 1F1B's formula.
"""

from __future__ import annotations

import argparse

import pytest

from ddp_tutorial.bench import microbatch
from ddp_tutorial.pipeline_parallel.orders import idle_fraction, peak_in_flight
from ddp_tutorial.pipeline_parallel.torch_schedules import ideal_run, runs_here, torch_orders


def _ideal_spawn(worker, p, args, **_):
    schedule, m = args[0], args[1]
    events = ideal_run("1F1B" if schedule == "1f1b" else schedule, p, m)
    return [{"events": [e for e in events if e[0] == r], "peak": peak_in_flight(events, r)} for r in range(p)]


def test_each_schedule_is_measured_against_its_own_ideal(monkeypatch):
    if torch_orders("Interleaved1F1B", 2, 4) is None:
        pytest.skip("this torch has no _schedule_visualizer.get_schedule_ops")
    monkeypatch.setattr(microbatch, "spawn", _ideal_spawn)
    result = microbatch.run_schedules(argparse.Namespace(forward_ms=1.0))
    rows = {(r["schedule"], r["p"], r["m"]): r for r in result.rows}
    assert max(result.ratios.values()) == pytest.approx(0, abs=1e-12)
    for (name, p, m), row in rows.items():
        v = row["v"]
        assert row["formula"] == pytest.approx((p - 1) / (v * m + p - 1))  # interleaved 1F1B's, written out
        if name in ("InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV"):
            assert row["ideal"] < row["formula"]
            if m >= 2 * p:  # about a third of the bubble (Qi et al. 2023); ZB-V's V needs m >= 2p to fill
                assert row["ideal"] < 0.5 * row["formula"]
        else:
            assert row["ideal"] == pytest.approx(row["formula"], abs=1e-12)
    assert ("DualPipeV", 4, 4) not in rows  # torch needs m >= 2p
    assert (("DualPipeV", 4, 8) in rows) == runs_here("DualPipeV", "gloo")
    assert rows[("Interleaved1F1B", 4, 8)]["peak_rank0"] == 5.5
    zb = rows[("InterleavedZeroBubble", 4, 8)]["ideal"]
    assert zb == pytest.approx(idle_fraction(ideal_run("InterleavedZeroBubble", 4, 8)))
