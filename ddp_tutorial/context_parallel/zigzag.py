"""Causal load balance for ring attention: the zig-zag layout (``20_long_sequences``).

With a causal mask a query attends only to keys before it. Cut the sequence into ``N``
contiguous shards and rank 0's queries see one block (its own, half masked) while rank
``N - 1``'s see all ``N``: the last rank computes about ``2N - 1`` times rank 0's scores, and
every ring step waits for the slowest. Zig-zag cuts the sequence into ``2N`` chunks and gives
rank ``r`` chunks ``r`` and ``2N - 1 - r``, an early one and a late one: every rank then
computes the same number of scores, ``2N`` chunk-blocks of work out of the ``2N^2`` in all
(Brandon et al. 2023, "Striped Attention", arXiv:2311.09431, and the ring-flash-attention
project's ``zigzag_ring_flash_attn``; torch's ``context_parallel`` calls it round-robin load
balancing). The ring itself does not change: ``ring_attention.RingAttention`` takes the
layout and skips each chunk pair that is masked whole.

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

__all__ = ["zigzag_attention", "scores_per_rank", "causal_scores", "main"]


def zigzag_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = True,
                     group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """``ring_attention`` for shards in the zig-zag layout (``shard_sequence(x, r, n, "zigzag")``):
    this rank's chunks ``r`` and ``2N - 1 - r`` concatenated along the sequence."""
    return RingAttention.apply(q, k, v, causal, group, "zigzag")


def scores_per_rank(world_size: int, seq: int, *, layout: str, causal: bool = True) -> list[int]:
    """The scores (query-key products) each rank computes over the whole ring, per batch row and head.

    Counted from ``block_pairs``, the schedule ``RingAttention`` follows: a full chunk pair is
    ``c^2`` scores, a diagonal one ``c (c + 1) / 2`` (the unmasked triangle), a skipped one none.
    """
    ids = [chunk_ids(r, world_size, layout) for r in range(world_size)]
    c = seq // (world_size * len(ids[0]))
    work = []
    for rank in range(world_size):
        total = 0
        for step in range(world_size):
            for _, _, diagonal in block_pairs(ids[rank], ids[(rank - step) % world_size], causal=causal):
                total += c * (c + 1) // 2 if diagonal else c * c
        work.append(total)
    return work


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
        print(f"{'OK' if ok else 'FAILED'}: zig-zag ring attention over {info.world_size} rank(s) equals causal SDPA "
              "on the whole sequence, output and q/k/v gradients")
        if not ok:
            raise SystemExit(1)


if __name__ == "__main__":
    main()
