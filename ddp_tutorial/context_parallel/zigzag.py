"""Causal load balance for ring attention: the zig-zag layout (``20_long_sequences``).

With a causal mask a query attends only to keys before it. Cut the sequence into ``N``
contiguous shards and rank 0's queries see one block (its own, half masked) while rank
``N - 1``'s see all ``N``: the last rank computes about ``2N - 1`` times rank 0's scores, and
every ring step waits for the slowest. Zig-zag cuts the sequence into ``2N`` chunks and gives
rank ``r`` chunks ``r`` and ``2N - 1 - r``, an early one and a late one: every rank then
computes the same number of scores at *every* step (two chunk-blocks), so no step waits for a
straggler. What the ring waits for is the critical path, ``sum over steps of the busiest rank's
work``: at large ``seq`` and ``N = 4``, 3.5 units of ``(seq/N)^2`` contiguous against 2.0
zig-zag (``critical_path``). The layout is the ring-flash-attention project's
``zigzag_ring_flash_attn``; torch's ``context_parallel`` uses it by default (its head-tail load
balancing). Striped Attention (Brandon et al. 2023, arXiv:2311.09431) is another balance,
token ``i`` on rank ``i mod N``. The ring itself does not change: ``ring_attention.RingAttention``
takes the layout and skips each chunk pair that is masked whole.

    torchrun --nproc-per-node=4 -m ddp_tutorial.context_parallel.zigzag   # the work per rank, both layouts
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist

from ddp_tutorial.context_parallel.ring_attention import (
    RingAttention,
    block_pairs,
    chunk_ids,
    compare,
    qkv_inputs,
    ring_case,
    tolerance,
)
from ddp_tutorial.env import distributed
from ddp_tutorial.launch.verdict import verdict

__all__ = ["zigzag_attention", "scores_per_step", "scores_per_rank", "critical_path", "causal_scores", "main"]


def zigzag_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = True,
                     group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """``ring_attention`` for shards in the zig-zag layout (``shard_sequence(x, r, n, "zigzag")``):
    this rank's chunks ``r`` and ``2N - 1 - r`` concatenated along the sequence."""
    return RingAttention.apply(q, k, v, causal, group, "zigzag")


def scores_per_step(world_size: int, seq: int, *, layout: str, causal: bool = True) -> list[list[int]]:
    """The scores (query-key products) each rank computes at each ring step, per batch row and head:
    one row per step, one column per rank.

    Counted from ``block_pairs``, the schedule ``RingAttention`` follows: a full chunk pair is
    ``c^2`` scores, a diagonal one ``c (c + 1) / 2`` (the unmasked triangle), a skipped one none.
    """
    ids = [chunk_ids(r, world_size, layout) for r in range(world_size)]
    c = seq // (world_size * len(ids[0]))
    steps = []
    for step in range(world_size):
        row = []
        for rank in range(world_size):
            pairs = block_pairs(ids[rank], ids[(rank - step) % world_size], causal=causal)
            row.append(sum(c * (c + 1) // 2 if diagonal else c * c for _, _, diagonal in pairs))
        steps.append(row)
    return steps


def scores_per_rank(world_size: int, seq: int, *, layout: str, causal: bool = True) -> list[int]:
    """The scores each rank computes over the whole ring: ``scores_per_step`` summed over the steps."""
    return [sum(column) for column in zip(*scores_per_step(world_size, seq, layout=layout, causal=causal))]


def critical_path(per_step: list[list[int]]) -> int:
    """The work the ring waits for: every step lasts as long as its busiest rank, ``sum_step max_rank``."""
    return sum(max(row) for row in per_step)


def causal_scores(seq: int) -> int:
    """The unmasked scores of a causal mask over ``seq`` positions, in one process: ``seq (seq + 1) / 2``."""
    return int(torch.ones(seq, seq).tril().sum().item())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq", type=int, default=32, help="sequence length, a multiple of 2 x world size")
    args = parser.parse_args()
    shape = (2, 2, args.seq, 8)
    with distributed() as (info, _):
        result = ring_case(info.rank, info.world_size, shape, causal=True, layout="zigzag")
        results = [None] * info.world_size
        dist.all_gather_object(results, result)
    if info.is_main:
        diff = compare(results, qkv_inputs(shape, torch.float32), causal=True, layout="zigzag")
        ok = max(diff.values()) < tolerance(torch.float32)
        for layout in ("contiguous", "zigzag"):
            print(f"{layout:>10}: scores per rank {scores_per_rank(info.world_size, args.seq, layout=layout)}")
        verdict(ok, f"zig-zag ring attention over {info.world_size} rank(s) equals causal SDPA "
                    "on the whole sequence, output and q/k/v gradients")


if __name__ == "__main__":
    main()
