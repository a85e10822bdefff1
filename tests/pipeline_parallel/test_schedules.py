"""Lesson 19: pipeline schedules as orders, 1F1B from scratch, torch's schedules, each equal to one process.

Covers ``ddp_tutorial.pipeline_parallel.orders``, ``ddp_tutorial.pipeline_parallel.one_f_one_b``,
``ddp_tutorial.pipeline_parallel.torch_schedules`` and ``ddp_tutorial.plots.schedules``.
"""

from __future__ import annotations

import itertools

import pytest

from ddp_tutorial.launch import spawn
from ddp_tutorial.pipeline_parallel.one_f_one_b import hand_worker, max_difference, one_process, received_after
from ddp_tutorial.pipeline_parallel.orders import (
    Deadlock,
    bubble_fraction,
    gpipe_order,
    idle_fraction,
    interleaved_peak,
    one_f_one_b_order,
    parse_action,
    peak_in_flight,
    simulate,
)
from ddp_tutorial.pipeline_parallel.torch_schedules import (
    SCHEDULES,
    ZERO_BUBBLE,
    ideal_run,
    runs_here,
    stage_delays,
    stage_indices,
    torch_orders,
)
from tests.pipeline_parallel.schedule_workers import every_schedule, fits

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
            # DualPipeV splits some backwards, not all
            assert kinds in ([["F", "B", "W"], ["F", "B"]] if split else [["F", "B"]]), (stage, i, kinds)


@pytest.mark.parametrize("world_size", [2, 4])
def test_every_schedule_equals_one_process_with_its_timeline_and_peaks(world_size):
    num_micro = 4
    results = spawn(every_schedule, world_size, args=(num_micro,), timeout=120)
    reference = one_process(2 * world_size, 2 * num_micro)
    names = ["gpipe", "1f1b", *(name for name in SCHEDULES if runs_here(name, "gloo") and fits(name, world_size, num_micro))]
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
        for name in ("ZBVZeroBubble", "DualPipeV"):
            if name in r:
                assert r[name]["stages"] == [rank, 2 * world_size - 1 - rank]


def test_only_the_v_schedules_on_gloo_before_2_14_are_skipped():
    for version in ("2.9.1", "2.10.0", "2.13.0"):
        assert [n for n in SCHEDULES if not runs_here(n, "gloo", version)] == ["ZBVZeroBubble", "DualPipeV"]
    assert all(runs_here(n, "gloo", v) for n in SCHEDULES for v in ("2.14.1", "2.15.0", "2.16.0.dev20270101", "3.0.0"))
    assert all(runs_here(n, "nccl", "2.9.1") for n in SCHEDULES)


def _bubble_over_useful(idle):
    return idle / (1 - idle)


@pytest.mark.parametrize("p, m", [(2, 4), (2, 8), (3, 6), (4, 8), (4, 16)])
def test_the_ideal_clock_gives_each_schedule_its_own_target(p, m):
    if torch_orders("Interleaved1F1B", p, m) is None:
        pytest.skip("this torch has no _schedule_visualizer.get_schedule_ops")
    v = 2
    # Narayanan et al. 2021 section 2.2, written out here: bubble (p - 1) slots of a stage, useful v m
    interleaved = idle_fraction(ideal_run("Interleaved1F1B", p, m))
    assert interleaved == pytest.approx((p - 1) / (v * m + p - 1), abs=1e-12)
    assert idle_fraction(ideal_run("LoopedBFS", p, m)) == pytest.approx((p - 1) / (v * m + p - 1), abs=1e-12)
    # Qi et al. 2023 section 3: with F = B = W the split backward leaves (p - 1)(F + B - W) against
    # (p - 1)(F + B + W): a third of the bubble over the useful time
    for name in ("InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV"):
        zb = idle_fraction(ideal_run(name, p, m))
        assert zb < interleaved
        assert _bubble_over_useful(zb) == pytest.approx(_bubble_over_useful(interleaved) / 3, rel=1e-9), name
    for name in ("GPipe", "1F1B"):
        assert idle_fraction(ideal_run(name, p, m)) == pytest.approx((p - 1) / (m + p - 1), abs=1e-12)


@pytest.mark.parametrize("p", [2, 3, 4])
def test_interleaved_1f1b_holds_korthikanti_s_peak_on_its_first_rank(p):
    if torch_orders("Interleaved1F1B", p, 2 * p) is None:
        pytest.skip("this torch has no _schedule_visualizer.get_schedule_ops")
    events = ideal_run("Interleaved1F1B", p, 2 * p)
    # Korthikanti et al. 2022 section 4.2.3, in stage-sized micro-batches: p v + p - 1 stages' worth
    assert peak_in_flight(events, 0) == 2 * p + p - 1
    assert peak_in_flight(events, 0) / 2 == interleaved_peak(p, 2)
    assert interleaved_peak(4, 2) == 5.5


def test_simulate_runs_ranks_of_several_stages_and_names_a_deadlock_by_rank():
    # 2 ranks, stages 0 and 1 on rank 0, stage 2 on rank 1: rank 0 hands 0 -> 1 to itself
    orders = [[(0, "F", 0), (1, "F", 0), (1, "I", 0), (0, "B", 0), (1, "W", 0), (0, "W", 0)], [(2, "F", 0), (2, "B", 0)]]
    durations = {"F": 1.0, "B": 1.0, "I": 1.0, "W": 1.0}
    events = simulate(orders, durations)
    assert [(e[1], e[2], e[4]) for e in events if e[0] == 0] == [(0, "F", 0), (1, "F", 1), (1, "B", 4), (0, "B", 5),
                                                                  (1, "W", 6), (0, "W", 7)]
    with pytest.raises(Deadlock, match=r"rank 0 at step 0 \(stage 1's B0\) waits for stage 2's B0"):
        simulate([[(1, "B", 0), (0, "F", 0), (1, "F", 0)], [(2, "F", 0), (2, "B", 0)]], durations)


def test_received_after_pairs_each_backward_with_the_next_forward():
    assert received_after(["F0", "F1", "B0", "F2", "B1", "B2"]) == {2: [0]}
    assert received_after(["F0", "B0", "B1", "F1"]) == {1: [0, 1]}  # not a valid order: only the pairing is tested
    assert received_after(gpipe_order(0, 2, 3)) == {}


def _activation_bytes(stage, p, rows=2, width=8, out=4):
    """One micro-batch's activations on a stage, counted by hand (float64): the input it received
    (not on stage 0: that is the batch), each ReLU's output (saved by ReLU, read by the next Linear),
    and on the last stage the last Linear's output (saved by the loss)."""
    received = 0 if stage == 0 else rows * width
    if stage < p - 1:
        return 8 * (received + 2 * rows * width)
    return 8 * (received + rows * width + rows * out)


@pytest.mark.parametrize("p", [2, 3])
def test_hand_1f1b_holds_p_minus_s_micro_batches_of_bytes_gpipe_m(p):
    gradient = 8 * 2 * 8  # one input gradient on its way back (rows x width float64)
    for m in (2 * p, 4 * p):
        gpipe = spawn(hand_worker, p, args=("gpipe", m), timeout=60)
        one_f_one_b = spawn(hand_worker, p, args=("1f1b", m), timeout=60)
        for s in range(p):
            assert gpipe[s]["peak_bytes"] >= m * _activation_bytes(s, p)
            assert one_f_one_b[s]["peak_bytes"] <= (p - s) * _activation_bytes(s, p) + (gradient if s else 0)
            assert one_f_one_b[s]["peak_bytes"] >= (p - s) * _activation_bytes(s, p)


def test_plot_schedule_draws_a_box_per_action_and_a_lane_per_rank():
    import matplotlib

    matplotlib.use("Agg")
    from ddp_tutorial.plots import plot_schedule

    events = simulate(_orders(one_f_one_b_order, 3, 4))
    ax = plot_schedule(events, unit="steps", title="1F1B")
    assert sum(len(c.get_paths()) for c in ax.collections) == len(events) == 3 * 2 * 4
    assert [t.get_text() for t in ax.get_yticklabels()] == ["rank 0", "rank 1", "rank 2"]
    assert ax.get_xlim()[1] >= max(e[5] for e in events)
