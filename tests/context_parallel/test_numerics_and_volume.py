"""Lesson 20: the stable merge in bf16, grouped-query attention on the ring, the bytes each method
sends, the critical path of the causal layouts, and torch's context-parallel defaults.

Covers ``ddp_tutorial.context_parallel.online_softmax``, ``ddp_tutorial.context_parallel.comm_volume``,
``ddp_tutorial.context_parallel.zigzag`` (per step) and ``ddp_tutorial.context_parallel.torch_cp``.
"""

from __future__ import annotations

import pytest
import torch

from ddp_tutorial.context_parallel.comm_volume import min_block_for_overlap, ring_bytes, ulysses_bytes, volume_worker
from ddp_tutorial.context_parallel.online_softmax import attend_block, merge_partials
from ddp_tutorial.context_parallel.ring_attention import (
    compare,
    loss_weight,
    qkv_inputs,
    ring_worker,
    shard_sequence,
    tolerance,
    unshard_sequence,
)
from ddp_tutorial.context_parallel.torch_cp import NO_GPU, cp_dispatched_ops, torch_cp_options, torch_cp_worker
from ddp_tutorial.context_parallel.zigzag import critical_path, scores_per_step
from ddp_tutorial.launch import spawn

BF16_TOLERANCE = 3e-2  # about one bf16 ulp (2^-7 x 4) for outputs up to 4


def blockwise(q, k, v, blocks, accumulate):
    out = torch.zeros(q.shape, dtype=accumulate)
    lse = torch.full(q.shape[:-1], float("-inf"), dtype=accumulate)
    for kb, vb in zip(k.chunk(blocks, dim=2), v.chunk(blocks, dim=2)):
        o_b, lse_b = attend_block(q, kb, vb)
        out, lse = merge_partials(out, lse, o_b, lse_b.to(accumulate))
    return out


def test_the_merge_in_bf16_with_large_logits_accumulates_in_float32():
    q, k, v = qkv_inputs((2, 4, 64, 16), torch.float64, kv_heads=2)
    q, k, v = (t.bfloat16() for t in (q * 20, k, v))  # scores up to about 120
    exact = [t.double() for t in (q, k, v)]  # the same bf16 numbers, in float64: only the method's error counts
    s = exact[0] @ exact[1].repeat_interleave(2, 1).transpose(-2, -1) / 4
    assert s.abs().max() > 88  # exp overflows float32 without the running max
    want = torch.nn.functional.softmax(s, dim=-1) @ exact[2].repeat_interleave(2, 1)  # written out, not SDPA
    good = blockwise(q, k, v, 8, torch.float32)
    assert torch.isfinite(good).all() and (good - want).abs().max() < BF16_TOLERANCE
    sdpa = torch.nn.functional.scaled_dot_product_attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1))
    assert (sdpa.double() - want).abs().max() < BF16_TOLERANCE  # torch's own kernel lands there too
    bad = blockwise(q, k, v, 8, torch.bfloat16)  # the running sums in bf16: far worse
    assert (bad.double() - want).abs().max() > 4 * (good - want).abs().max()


def test_a_fully_masked_block_leaves_the_running_result_alone():
    q, k, v = qkv_inputs((1, 2, 3, 4), torch.float64)
    o_a, lse_a = attend_block(q, k, v)
    masked_lse = torch.full_like(lse_a, float("-inf"))
    o_b = torch.full_like(o_a, float("nan"))  # whatever a kernel left there: ignored
    out, lse = merge_partials(o_a, lse_a, torch.zeros_like(o_a), masked_lse)
    assert torch.equal(out, o_a) and torch.equal(lse, lse_a)
    empty = merge_partials(torch.zeros_like(o_a), masked_lse, torch.zeros_like(o_a), masked_lse)
    assert torch.isfinite(empty[0]).all() and torch.isinf(empty[1]).all()
    assert o_b.isnan().all()


@pytest.mark.parametrize("n", [2, 4])
def test_the_ring_with_grouped_query_attention_and_bf16_equals_sdpa(n):
    cases = [{"shape": (1, 4, 16, 8), "causal": causal, "dtype": torch.float64, "kv_heads": 2}
             for causal in (False, True)] + [{"shape": (1, 4, 16, 8), "causal": True, "dtype": torch.bfloat16}]
    results = spawn(ring_worker, n, args=(cases,), timeout=90, quiet=True)
    for i, case in enumerate(cases[:2]):
        full = qkv_inputs(case["shape"], torch.float64, kv_heads=2)
        diff = compare([r[i] for r in results], full, causal=case["causal"])
        assert max(diff.values()) < tolerance(torch.float64), diff
        assert results[0][i]["dk"].shape[1] == 2  # the K/V gradient has the K/V heads
    # bf16: against SDPA in float64 on the same bf16 numbers, with the loss weight the ranks used
    q, k, v = (t.double().requires_grad_() for t in qkv_inputs((1, 4, 16, 8), torch.bfloat16))
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    (out * loss_weight(out.shape, torch.bfloat16).double()).sum().backward()
    for key, want in (("out", out.detach()), ("dq", q.grad), ("dk", k.grad), ("dv", v.grad)):
        got = unshard_sequence([r[2][key].double() for r in results])
        assert (got - want).abs().max() < BF16_TOLERANCE * max(1.0, want.abs().max().item()), key


@pytest.mark.parametrize("n", [2, 4])
def test_bytes_sent_match_the_formulas(n):
    shape, kv_heads = (1, 4, 16, 8), 2
    results = spawn(volume_worker, n, args=(shape, kv_heads), timeout=60, quiet=True)
    a = 1 * 4 * (16 // n) * 8 * 4  # batch x heads x seq/N x head_dim float32 bytes
    for r in results:
        assert r["A"] == a
        # counted another way: the ring sends K and V (each batch x kv_heads x seq/N x head_dim) N - 1 times
        assert r["ring"] == (n - 1) * 2 * a == ring_bytes(n, a, heads=4, kv_heads=4)
        assert r["ring, GQA"] == (n - 1) * 2 * (a // 2) == ring_bytes(n, a, heads=4, kv_heads=kv_heads)
        # four all-to-alls, each sending N - 1 of its N parts away
        assert r["Ulysses"] == 4 * a * (n - 1) // n == ulysses_bytes(n, a)


def test_the_overlap_condition_balances_compute_and_transfer():
    flops, bandwidth, b, h, h_kv, d = 989e12, 50e9, 1, 32, 8, 128
    c = min_block_for_overlap(flops, bandwidth, heads=h, kv_heads=h_kv)
    compute = 4 * b * h * c * c * d / flops
    transfer = 2 * b * h_kv * c * d * 2 / bandwidth
    assert compute == pytest.approx(transfer)


@pytest.mark.parametrize("n", [2, 3, 4])
def test_work_per_step_is_counted_from_the_mask(n):
    seq = 8 * n
    mask = torch.ones(seq, seq).tril()  # one process's causal mask
    for layout in ("contiguous", "zigzag"):
        per_step = scores_per_step(n, seq, layout=layout)
        pos = [shard_sequence(torch.arange(seq).view(1, 1, seq, 1), r, n, layout).flatten() for r in range(n)]
        for step in range(n):
            for rank in range(n):
                held = pos[(rank - step) % n]
                assert per_step[step][rank] == mask[pos[rank]][:, held].sum().item()
    zigzag = scores_per_step(n, seq, layout="zigzag")
    assert all(len(set(row)) == 1 for row in zigzag)  # balanced at every step, not only in total


def test_critical_path_at_four_ranks_is_3_5_against_2_0():
    seq = 4800
    unit = (seq // 4) ** 2
    assert round(critical_path(scores_per_step(4, seq, layout="contiguous")) / unit, 2) == 3.5
    assert round(critical_path(scores_per_step(4, seq, layout="zigzag")) / unit, 2) == 2.0


def test_torch_cp_defaults_are_all_gather_and_load_balanced():
    assert torch_cp_options() == {"rotate_method": "ALL_GATHER", "enable_load_balance": True, "convert_to_f32": True}
    ops = cp_dispatched_ops()
    assert "_scaled_dot_product_flash_attention" in ops and "_scaled_dot_product_efficient_attention" in ops
    assert all("flash" in op or "efficient" in op or "cudnn" in op for op in ops)  # fused kernels only
    if not torch.cuda.is_available():
        assert torch_cp_worker(0, 1) == {"line": NO_GPU}
