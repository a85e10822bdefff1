"""Lesson 19: pipeline schedules as orders, 1F1B from scratch, torch's schedules, each equal to one process.

Covers ``ddp_tutorial.pipeline_parallel.orders``, ``ddp_tutorial.pipeline_parallel.one_f_one_b``,
``ddp_tutorial.pipeline_parallel.torch_schedules`` and ``ddp_tutorial.plots.schedules``.
"""

from __future__ import annotations

import itertools

import pytest

from ddp_tutorial.launch import spawn
from ddp_tutorial.pipeline_parallel.one_f_one_b import max_difference, one_process
from ddp_tutorial.pipeline_parallel.orders import (
    Deadlock,
    bubble_fraction,
    gpipe_order,
    idle_fraction,
    one_f_one_b_order,
    parse_action,
    peak_in_flight,
    simulate,
)
from ddp_tutorial.pipeline_parallel.torch_schedules import (
    SCHEDULES,
    ZERO_BUBBLE,
    runs_here,
    stage_delays,
    stage_indices,
)
from tests.pipeline_parallel.schedule_workers import every_schedule

SIZES = sorted({(p, m) for p in range(1, 6) for m in (p, p + 1, 2 * p, 10)})


def _orders(order, p, m):
    return [order(s, p, m) for s in range(p)]


@pytest.mark.parametrize("order", [gpipe_order, one_f_one_b_order])
@pytest.mark.parametrize("p, m", SIZES)
def test_each_order_runs_every_action_once_forward_before_backward(order, p, m):
    for s in range(p):
        actions = order(s, p, m)
        assert sorted(actions) == sorted([f"F{i}" for i in range(m)] + [f"B{i}" for i in range(m)])
        for i in range(m):
            assert actions.index(f"F{i}") < actions.index(f"B{i}")


@pytest.mark.parametrize("p, m", SIZES)
def test_simulated_bubble_meets_the_formula_and_the_peaks_are_m_and_p_minus_s(p, m):
    # the formula counts slots: (m + p - 1) of them, m busy; the simulation adds up F = 1, B = 2
    for order in (gpipe_order, one_f_one_b_order):
        events = simulate(_orders(order, p, m))
        assert idle_fraction(events) == pytest.approx(bubble_fraction(p, m), abs=1e-12)
    gpipe = simulate(_orders(gpipe_order, p, m))
    one_f_one_b = simulate(_orders(one_f_one_b_order, p, m))
    assert [peak_in_flight(gpipe, s) for s in range(p)] == [m] * p
    assert [peak_in_flight(one_f_one_b, s) for s in range(p)] == [p - s for s in range(p)]


def test_bubble_formula_values():
    assert bubble_fraction(4, 8) == 3 / 11
    assert bubble_fraction(4, 8, virtual=2) == 3 / 19
    assert bubble_fraction(1, 4) == 0


def test_a_backward_waiting_for_a_later_forward_deadlocks_and_is_named():
    # stage 0 wants B0 back before it sends F1; stage 1 wants F1 before it sends B0
    orders = [["F0", "B0", "F1", "B1"], ["F0", "F1", "B0", "B1"]]
    with pytest.raises(Deadlock, match=r"stage 0 at step 1 \(B0\) waits for stage 1's B0.*stage 1 at step 1 \(F1\)"):
        simulate(orders)
    with pytest.raises(Deadlock, match="its own F0"):
        simulate([["B0", "F0"]])


def test_parse_action_refuses_what_is_not_an_action():
    assert parse_action("F12") == ("F", 12)
    for bad in ("X1", "F", "B-1", "f1"):
        with pytest.raises(ValueError, match="is not an action"):
            parse_action(bad)


def test_peak_counts_a_split_backward_until_its_weight_half():
    events = [(0, 0, "F", 0, 0, 1), (0, 0, "F", 1, 1, 2), (0, 0, "B", 0, 2, 3), (0, 0, "B", 1, 3, 4),
              (0, 0, "W", 0, 4, 5), (0, 0, "W", 1, 5, 6)]
    assert peak_in_flight(events) == 2
    assert peak_in_flight(events[:4]) == 2
    one_at_a_time = [(0, 0, "F", 0, 0, 1), (0, 0, "B", 0, 1, 2), (0, 0, "F", 1, 2, 3), (0, 0, "B", 1, 3, 4)]
    assert peak_in_flight(one_at_a_time) == 1


@pytest.mark.parametrize("p", [2, 3, 4])
def test_stage_placements_cover_every_stage_once(p):
    for per_rank, placement in ((1, "loop"), (2, "loop"), (2, "v")):
        held = [stage_indices(r, p, per_rank, placement) for r in range(p)]
        assert sorted(itertools.chain(*held)) == list(range(per_rank * p))
    assert stage_indices(0, p, 2, "v") == [0, 2 * p - 1]  # the V: first and last stage on rank 0
    assert stage_indices(1, p, 2, "loop") == [1, p + 1]
    with pytest.raises(ValueError, match="2 stages per rank"):
        stage_indices(0, p, 3, "v")


def test_stage_delays_keep_a_rank_busy_as_long_whatever_the_schedule():
    d = {"F": 0.01, "B": 0.02}
    for name, (_, per_rank, _) in SCHEDULES.items():
        delays = stage_delays(name, d)
        assert per_rank * sum(delays.values()) == pytest.approx(0.03)
        assert ("W" in delays) == (name in ZERO_BUBBLE)
    assert stage_delays("1F1B", None) is None


def _check_timeline(result, num_micro, split):
    events = result["events"]
    for stage in result["stages"]:
        for i in range(num_micro):
            mine = [e for e in events if e[1] == stage and e[3] == i]
            kinds = [e[2] for e in sorted(mine, key=lambda e: e[4])]
            assert kinds == (["F", "B", "W"] if split else ["F", "B"]), (stage, i, kinds)


@pytest.mark.parametrize("world_size", [2, 4])
def test_every_schedule_equals_one_process_with_its_timeline_and_peaks(world_size):
    num_micro = 4
    results = spawn(every_schedule, world_size, args=(num_micro,), timeout=120)
    reference = one_process(2 * world_size, 2 * num_micro)
    names = ["gpipe", "1f1b", *(name for name in SCHEDULES if runs_here(name, "gloo"))]
    assert set(results[0]) == set(names)
    for name in names:
        by_rank = [r[name] for r in results]
        diff = max_difference(by_rank, reference)
        assert max(diff.values()) < 1e-12, (name, diff)
        for r in by_rank:
            _check_timeline(r, num_micro, name in ZERO_BUBBLE)
    for name in ("gpipe", "GPipe"):
        assert [r[name]["peak"] for r in results] == [num_micro] * world_size
    for name in ("1f1b", "1F1B"):
        assert [r[name]["peak"] for r in results] == [world_size - s for s in range(world_size)]
    assert [r["1f1b"]["order"] for r in results] == _orders(one_f_one_b_order, world_size, num_micro)
    for rank, r in enumerate(results):
        assert r["Interleaved1F1B"]["stages"] == [rank, rank + world_size]
        if "ZBVZeroBubble" in r:
            assert r["ZBVZeroBubble"]["stages"] == [rank, 2 * world_size - 1 - rank]


def test_only_zbv_on_gloo_before_2_14_is_skipped():
    for version in ("2.9.1", "2.10.0", "2.13.0"):
        assert [n for n in SCHEDULES if not runs_here(n, "gloo", version)] == ["ZBVZeroBubble"]
    assert all(runs_here(n, "gloo", v) for n in SCHEDULES for v in ("2.14.1", "2.15.0", "2.16.0.dev20270101", "3.0.0"))
    assert all(runs_here(n, "nccl", "2.9.1") for n in SCHEDULES)


def test_plot_schedule_draws_a_box_per_action_and_a_lane_per_rank():
    import matplotlib

    matplotlib.use("Agg")
    from ddp_tutorial.plots import plot_schedule

    events = simulate(_orders(one_f_one_b_order, 3, 4))
    ax = plot_schedule(events, unit="steps", title="1F1B")
    assert sum(len(c.get_paths()) for c in ax.collections) == len(events) == 3 * 2 * 4
    assert [t.get_text() for t in ax.get_yticklabels()] == ["rank 0", "rank 1", "rank 2"]
    assert ax.get_xlim()[1] >= max(e[5] for e in events)
