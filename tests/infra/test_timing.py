"""ddp_tutorial.timing: the best of several runs, on a clock the test controls (no assert on real time)."""

from __future__ import annotations

import pytest

from ddp_tutorial import timing


def test_timed_returns_the_fastest_timed_call_after_the_untimed_warm_up(monkeypatch):
    durations = iter([9.0, 0.5, 0.25, 0.75])  # the warm-up call (9 s) must not count
    now = [0.0]
    calls = []

    def fake_clock() -> float:
        return now[0]

    def work():
        calls.append(now[0])
        now[0] += next(durations)

    monkeypatch.setattr(timing.time, "perf_counter", fake_clock)
    assert timing.timed(work, repeat=3, warmup=1) == pytest.approx(0.25)
    assert len(calls) == 4
