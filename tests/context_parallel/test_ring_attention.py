"""Lesson 20: ring attention from scratch, and its zig-zag layout, equal to SDPA on the whole sequence.

Every result is stitched back from the ranks' shards and compared with torch's
``scaled_dot_product_attention`` run in one process on the whole sequence: the output and the
gradients of q, k and v, causal or not, for N = 1..4 ranks, in float32 and float64.

Covers ``ddp_tutorial.context_parallel.ring_attention``.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from ddp_tutorial.context_parallel.online_softmax import attend_block, merge_partials
from ddp_tutorial.context_parallel.ring_attention import (
    block_pairs,
    chunk_ids,
    compare,
    loss_weight,
    qkv_inputs,
    ring_attention,
    ring_worker,
    shard_sequence,
    tolerance,
    unshard_sequence,
)
from ddp_tutorial.context_parallel.zigzag import zigzag_attention
from ddp_tutorial.launch import spawn

SHAPE = (2, 2, 24, 4)  # 24 positions: 2N chunks for N = 1, 2, 3, 4
CASES = [{"shape": SHAPE, "causal": causal, "dtype": dtype, "layout": layout}
         for layout in ("contiguous", "zigzag") for causal in (False, True) for dtype in (torch.float32, torch.float64)]


# ---------------------------------------------------------------- pure: layouts and the merge

def test_zigzag_gives_rank_r_chunks_r_and_2n_minus_1_minus_r():
    assert [chunk_ids(r, 4, "zigzag") for r in range(4)] == [[0, 7], [1, 6], [2, 5], [3, 4]]
    assert [chunk_ids(r, 3) for r in range(3)] == [[0], [1], [2]]
    with pytest.raises(ValueError, match="layout 'striped'"):
        chunk_ids(0, 2, "striped")


@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_shards_cover_the_sequence_once_and_stitch_back(layout, n):
    x = torch.arange(24).reshape(1, 1, 24, 1)
    parts = [shard_sequence(x, r, n, layout) for r in range(n)]
    assert sorted(torch.cat(parts, dim=2).flatten().tolist()) == list(range(24))
    assert torch.equal(unshard_sequence(parts, layout), x)
    with pytest.raises(ValueError, match="does not split"):
        shard_sequence(torch.zeros(1, 1, 5, 1), 0, 2, layout)


def test_causal_pairs_skip_later_chunks_and_mask_the_diagonal():
    assert block_pairs([1, 6], [2, 5], causal=True) == [(1, 0, False), (1, 1, False)]
    assert block_pairs([2], [2], causal=True) == [(0, 0, True)]
    assert block_pairs([0], [3], causal=False) == [(0, 0, False)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_merging_two_blocks_equals_softmax_over_both(dtype):
    q, k, v = qkv_inputs((2, 3, 5, 4), dtype)
    whole, whole_lse = attend_block(q, k, v)
    a, b = attend_block(q, k[:, :, :2], v[:, :, :2]), attend_block(q, k[:, :, 2:], v[:, :, 2:])
    out, lse = merge_partials(*a, *b)
    sdpa = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    assert (out - sdpa).abs().max() < tolerance(dtype) and (whole - sdpa).abs().max() < tolerance(dtype)
    assert (lse - torch.logsumexp(q @ k.transpose(-2, -1) / 2, dim=-1)).abs().max() < tolerance(dtype)
    first = merge_partials(torch.zeros_like(q), torch.full(q.shape[:-1], float("-inf"), dtype=dtype), *a)
    assert torch.equal(first[0], a[0]) and torch.equal(first[1], a[1])  # nothing seen yet: the block itself
    assert (a[0] - sdpa).abs().max() > 0.01  # one block alone is not the answer


# ---------------------------------------------------------------- the ring: N = 1..4

@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_ring_attention_equals_sdpa_output_and_gradients(n):
    results = spawn(ring_worker, n, args=(CASES,), timeout=90, quiet=True)
    for i, case in enumerate(CASES):
        diff = compare([r[i] for r in results], qkv_inputs(SHAPE, case["dtype"]), causal=case["causal"],
                       layout=case["layout"])
        assert max(diff.values()) < tolerance(case["dtype"]), (case, diff)
        if n > 1 and case["causal"]:  # the reference can tell: the non-causal answer is far off
            wrong = compare([r[i] for r in results], qkv_inputs(SHAPE, case["dtype"]), causal=False,
                            layout=case["layout"])
            assert wrong["out"] > 0.01



def subgroup_worker(rank: int, world_size: int) -> dict:
    """Two rings of 2 in a world of 4 ({0, 1} and {2, 3}): the public functions with ``group=``."""
    groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]  # every rank creates every group
    group = groups[rank // 2]
    me = dist.get_rank(group)
    out = {}
    for name, fn, layout in (("ring", ring_attention, "contiguous"), ("zigzag", zigzag_attention, "zigzag")):
        full = qkv_inputs(SHAPE, torch.float64)
        q, k, v = (shard_sequence(t, me, 2, layout).requires_grad_() for t in full)
        o = fn(q, k, v, causal=True, group=group)
        (o * shard_sequence(loss_weight(SHAPE, torch.float64), me, 2, layout)).sum().backward()
        out[name] = {"out": o.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad}
    return out


def test_ring_attention_on_subgroups_uses_each_groups_own_ring():
    results = spawn(subgroup_worker, 4, timeout=90, quiet=True)
    for ring in (results[:2], results[2:]):
        for name, layout in (("ring", "contiguous"), ("zigzag", "zigzag")):
            diff = compare([r[name] for r in ring], qkv_inputs(SHAPE, torch.float64), causal=True, layout=layout)
            assert max(diff.values()) < tolerance(torch.float64), (name, diff)
