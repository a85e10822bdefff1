"""The step-time model's terms against independent counts: lesson 06's ring, hand calculations from the
textbook definitions, flops.py, and lesson 19's simulated schedules (issue 39); the sourced figures of
``ddp_tutorial.performance.hardware`` it runs on. Covers ``ddp_tutorial.performance.stepmodel``,
``ddp_tutorial.performance.steplayout`` and ``ddp_tutorial.performance.stepcomm``."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ddp_tutorial.comm.ring import ring_jobs, segment_bounds
from ddp_tutorial.context_parallel.comm_volume import ulysses_step_bytes
from ddp_tutorial.launch import spawn
from ddp_tutorial.performance.flops import TransformerShape, training_flops
from ddp_tutorial.performance.hardware import A100, B200, H100, H200, HARDWARE
from ddp_tutorial.performance.stepcomm import cp_seconds, ulysses_tensor_bytes
from ddp_tutorial.performance.stepmodel import (
    StepLayout,
    dp_seconds,
    group_link,
    pp_seconds,
    predict,
    ring_bytes,
    tp_seconds,
)
from ddp_tutorial.pipeline_parallel.orders import idle_fraction, one_f_one_b_order, simulate
from ddp_tutorial.pipeline_parallel.torch_schedules import ideal_run

SHAPE = TransformerShape(vocab=32000, dim=1024, layers=4, heads=16, seq=2048)
# latency 0: the bytes alone decide, so ratios of times are ratios of bytes
NO_ALPHA = replace(H100, latency_s=0.0)


@pytest.mark.parametrize("n", [2, 3, 4, 5])
def test_ring_volumes_equal_what_lesson_06s_ring_receives(n):
    numel, itemsize = 60 * n, 4
    received = []
    for rank in range(n):
        jobs, reducing = ring_jobs(rank, n, segment_bounds(numel, n), piece=7)
        sizes = [b - a for _, a, b in jobs]
        received.append((sum(sizes[:reducing]), sum(sizes[reducing:])))
    # in a ring each rank sends exactly what its right neighbour receives
    scatter = sum(r for r, _ in received) / n * itemsize
    gather = sum(g for _, g in received) / n * itemsize
    assert ring_bytes("reduce_scatter", numel * itemsize, n) == pytest.approx(scatter)
    assert ring_bytes("all_gather", numel * itemsize, n) == pytest.approx(gather)
    assert ring_bytes("all_reduce", numel * itemsize, n) == pytest.approx(scatter + gather)


def test_all_gather_by_hand():
    # 4 ranks each hold a 1 MB shard of a 4 MB result: each sends its shard to 3 others, 3 MB
    assert ring_bytes("all_gather", 4e6, 4) == 3e6
    with pytest.raises(ValueError, match="no collective 'broadcast'"):
        ring_bytes("broadcast", 1.0, 2)


def test_tp_time_by_hand():
    layout = StepLayout(tp=2, micro_batches=3)
    # activation b x s x h bf16 = 1 x 2048 x 1024 x 2 = 4,194,304 bytes; a 2-rank all-reduce sends
    # 2 (2-1)/2 of it = 4,194,304 bytes in 2 ring steps; 4 all-reduces per layer, 4 layers, 3 microbatches
    one = 2 * H100.latency_s + 4_194_304 / 450e9
    assert tp_seconds(SHAPE, layout, H100) == pytest.approx(4 * 4 * 3 * one)
    # recomputation runs the forward's two all-reduces again
    assert tp_seconds(SHAPE, replace(layout, recompute=True), H100) == pytest.approx(6 * 4 * 3 * one)


def test_sequence_parallel_moves_the_same_bytes_as_tensor_parallel():
    # a reduce-scatter and an all-gather: (n-1)/n twice, n-1 ring steps twice, as one all-reduce
    plain, sp = StepLayout(tp=4), StepLayout(tp=4, sequence_parallel=True)
    assert tp_seconds(SHAPE, sp, NO_ALPHA) == pytest.approx(tp_seconds(SHAPE, plain, NO_ALPHA))
    assert tp_seconds(SHAPE, sp, H100) == pytest.approx(tp_seconds(SHAPE, plain, H100))


def test_tp_across_the_network_is_slower_than_on_nvlink():
    inside, across = StepLayout(tp=8), StepLayout(tp=16)
    assert group_link(inside, "tp", H100) == H100.nvlink_bytes_per_s
    assert group_link(across, "tp", H100) == H100.network_bytes_per_s
    # bytes per rank 2 (15/16) vs 2 (7/8) of the activation, at 50 GB/s vs 450 GB/s: (15/16)/(7/8) x 9
    ratio = tp_seconds(SHAPE, across, NO_ALPHA) / tp_seconds(SHAPE, inside, NO_ALPHA)
    assert ratio == pytest.approx(15 / 16 / (7 / 8) * 9)
    assert tp_seconds(SHAPE, across, H100) > 3 * tp_seconds(SHAPE, inside, H100)  # with the latency too
    # the groups nest TP, CP, PP, DP: DP over 2 ranks after TP 4 still fits in one node of 8, after TP 8 not
    assert group_link(StepLayout(tp=4, dp=2), "dp", H100) == H100.nvlink_bytes_per_s
    assert group_link(StepLayout(tp=8, dp=2), "dp", H100) == H100.network_bytes_per_s


def test_zero3_moves_one_and_a_half_times_ddps_bytes():
    times = {z: dp_seconds(SHAPE, StepLayout(dp=8, zero=z), NO_ALPHA) for z in range(4)}
    assert times[1] == pytest.approx(times[0]) and times[2] == pytest.approx(times[0])
    assert times[3] / times[0] == pytest.approx(1.5)
    # by hand: every weight and the embedding, bf16, 2 (8-1)/8 of them over NVLink
    params = 4 * 12 * 1024 * 1024 + 2 * 32000 * 1024
    assert times[0] == pytest.approx(params * 2 * 2 * 7 / 8 / 450e9)


def test_compute_time_is_flops_py_counts_over_the_achievable_rate():
    layout = StepLayout(dp=2, tp=2, micro_batches=4, micro_batch=2)
    tokens = 2 * 4 * 2 * SHAPE.seq
    step = predict(SHAPE, layout, H100)
    assert step.compute_s == pytest.approx(training_flops(SHAPE, tokens).hardware / 4 / 794.5e12)
    again = predict(SHAPE, replace(layout, recompute=True), H100)
    assert again.compute_s / step.compute_s == pytest.approx(4 / 3)  # one more forward of three
    assert again.model_flops == step.model_flops  # recomputation is not model FLOPs


@pytest.mark.parametrize("stages,micro", [(2, 1), (2, 4), (4, 4), (4, 8), (8, 6)])
def test_bubble_equals_the_idle_slots_of_a_simulated_1f1b(stages, micro):
    free = replace(H100, latency_s=0.0, network_bytes_per_s=float("inf"), nvlink_bytes_per_s=float("inf"))
    step = predict(SHAPE, StepLayout(pp=stages, micro_batches=micro), free)
    orders = [one_f_one_b_order(s, stages, micro) for s in range(stages)]
    assert step.bubble_s / step.step_s == pytest.approx(idle_fraction(simulate(orders)))


def test_more_microbatches_shrink_the_bubble():
    shares = [(s := predict(SHAPE, StepLayout(pp=4, micro_batches=m), H100)).bubble_s / s.step_s for m in (1, 4, 16, 64)]
    assert shares == sorted(shares, reverse=True) and shares[-1] < shares[0] / 10


def test_pp_sends_activations_forward_and_gradients_back():
    layout = StepLayout(pp=2, micro_batches=5)
    # 5 microbatches x (activation out + gradient in), 4,194,304 bytes each, both stages in one node
    assert pp_seconds(SHAPE, layout, H100) == pytest.approx(10 * (H100.latency_s + 4_194_304 / 450e9))


def test_dp_traffic_hides_behind_compute_and_mfu_is_against_the_peak():
    step = predict(SHAPE, StepLayout(dp=8, micro_batches=8), H100)
    assert step.comm["dp"] > 0 and step.exposed["dp"] == 0.0
    assert step.mfu == pytest.approx(step.model_flops / step.step_s / 8 / 989e12)
    assert step.mfu == pytest.approx(794.5 / 989)  # compute-bound: all the achievable share of the peak


def test_layout_and_hardware_refuse_bad_values():
    with pytest.raises(ValueError, match="zero must be a stage 0-3"):
        StepLayout(zero=4)
    with pytest.raises(ValueError, match="tp must be at least 1"):
        StepLayout(tp=0)
    with pytest.raises(ValueError, match="achievable"):
        replace(H100, achievable_flops=2 * H100.peak_flops)


def test_every_hardware_figure_has_a_source():
    assert set(HARDWARE.values()) >= {A100, H100, H200, B200}
    for hw in HARDWARE.values():
        assert set(hw.sources) == {"peak_flops", "achievable_flops", "hbm_bytes_per_s", "nvlink_bytes_per_s",
                                   "network_bytes_per_s", "latency_s"}
        assert hw.achievable_flops / hw.peak_flops > 0.7  # MAMF tables: 77-87% of the dense peak


def test_ring_attention_passes_k_and_v_round_the_ring_by_hand():
    layout = StepLayout(cp=4)
    # K and V shards: 2 x (2048 / 4 tokens) x 1024 x 2 bytes = 2,097,152 bytes, passed 3 steps round a ring
    # of 4; forward once, backward twice the bytes (K, V and their gradients); 4 layers; NVLink
    expected = 4 * 3 * 3 * (H100.latency_s + 2_097_152 / 450e9)
    step = predict(SHAPE, layout, H100)
    assert step.comm["cp"] == pytest.approx(expected)
    # hidden behind attention's compute while it is shorter, the excess exposed
    attention = training_flops(SHAPE, SHAPE.seq).attention / 4 / H100.achievable_flops
    assert step.exposed["cp"] == pytest.approx(max(0.0, expected - attention))
    # grouped-query attention: 4 KV heads of 16 send a quarter
    gqa = replace(SHAPE, kv_heads=4)
    assert predict(gqa, layout, NO_ALPHA).comm["cp"] == pytest.approx(predict(SHAPE, layout, NO_ALPHA).comm["cp"] / 4)


def test_ulysses_all_to_alls_by_hand():
    layout = StepLayout(cp=4, cp_kind="ulysses")
    # q, k, v and the output: each 1 x (2048 / 4 tokens) x 1024 x 2 bytes = 1,048,576 bytes; an all-to-all over
    # 4 ranks sends 3 of its 4 parts away in 3 ring steps; forward and backward, 4 layers, NVLink
    one = 3 * H100.latency_s + 1_048_576 * 3 / 4 / 450e9
    step = predict(SHAPE, layout, H100)
    assert step.comm["cp"] == pytest.approx(2 * 4 * 4 * one)
    assert step.exposed["cp"] == step.comm["cp"]  # before and after attention: nothing to hide behind
    # recomputation runs the forward's four again
    assert cp_seconds(SHAPE, replace(layout, recompute=True), H100) == pytest.approx(3 * 4 * 4 * one)
    # tensor parallelism splits the heads: each rank's tensors are half as big, the ring steps the same
    bytes_only = cp_seconds(SHAPE, replace(layout, tp=2), NO_ALPHA) / cp_seconds(SHAPE, layout, NO_ALPHA)
    assert bytes_only == pytest.approx(0.5)


def test_ulysses_sends_fewer_bytes_than_the_ring_and_needs_the_heads_to_split():
    ring, ulysses = StepLayout(cp=8), StepLayout(cp=8, cp_kind="ulysses")
    # per layer, A one whole-sequence activation: the ring passes K and V (2 A / 8) 7 steps, forward and twice
    # backward; Ulysses sends 7/8 of q, k, v, out (A / 8 each), forward and backward
    ratio = cp_seconds(SHAPE, ring, NO_ALPHA) / cp_seconds(SHAPE, ulysses, NO_ALPHA)
    assert ratio == pytest.approx((3 * 7 * 2) / (2 * 4 * 7 / 8))
    # grouped-query attention: 4 KV heads of 16, fewer k and v bytes; with tp 4 one KV head per rank is
    # replicated to one per CP rank (2): k and v as big as with 8 KV heads
    gqa = replace(SHAPE, kv_heads=4)
    assert ulysses_tensor_bytes(gqa, StepLayout(cp=2, cp_kind="ulysses"))["k"] == pytest.approx(1 * 1024 * 256 * 2)
    assert ulysses_tensor_bytes(gqa, StepLayout(tp=4, cp=2, cp_kind="ulysses"))["k"] == pytest.approx(1024 * 2 * 64 * 2)
    with pytest.raises(ValueError, match="heads divisible by tp x cp"):
        cp_seconds(SHAPE, StepLayout(tp=4, cp=8, cp_kind="ulysses"), H100)
    with pytest.raises(ValueError, match="cp_kind must be one of ring, ulysses"):
        StepLayout(cp_kind="allgather")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("n", [2, 4])
def test_ulysses_volume_equals_the_bytes_lesson_20s_ulysses_sends(n):
    b, heads, seq, head_dim = 1, 4, 16, 8
    sent = spawn(ulysses_step_bytes, n, args=((b, heads, seq, head_dim),), backend="gloo", timeout=90, quiet=True)
    shape = TransformerShape(vocab=8, dim=heads * head_dim, layers=1, heads=heads, seq=seq)
    per_pass = sum(ring_bytes("all_to_all", a, n) for a in ulysses_tensor_bytes(shape, StepLayout(cp=n)).values())
    # the course's run is float32, the model bf16: twice the bytes; forward and backward, one layer
    assert sent == [2 * 2 * per_pass] * n


@pytest.mark.parametrize("stages,micro", [(2, 4), (3, 6), (4, 8)])
def test_interleaved_bubble_equals_the_idle_share_of_torchs_interleaved_1f1b(stages, micro):
    events = ideal_run("Interleaved1F1B", stages, micro)  # two stages per rank, on lesson 19's ideal clock
    if events is None:
        pytest.skip("this torch has no _schedule_visualizer.get_schedule_ops")
    free = replace(H100, latency_s=0.0, network_bytes_per_s=float("inf"), nvlink_bytes_per_s=float("inf"))
    step = predict(SHAPE, StepLayout(pp=stages, micro_batches=micro, virtual=2), free)
    assert step.bubble_s / step.step_s == pytest.approx(idle_fraction(events))


def test_interleaving_sends_v_times_the_activations():
    # 5 microbatches x 2 virtual stages x (activation out + gradient in), 4,194,304 bytes each, NVLink
    layout = StepLayout(pp=2, micro_batches=5, virtual=2)
    assert pp_seconds(SHAPE, layout, H100) == pytest.approx(20 * (H100.latency_s + 4_194_304 / 450e9))
