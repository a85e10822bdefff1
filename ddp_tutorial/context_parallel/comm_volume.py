"""What ring attention and Ulysses send, counted from real runs and held against the formulas (``20_long_sequences``).

Per rank and per attention forward, with ``A`` the bytes of one local activation tensor
(``batch x heads x seq/N x head_dim``):

- the **ring** sends its K and V blocks on ``N - 1`` times: ``2 (N - 1) A``, or ``2 (N - 1) A
  kv_heads / heads`` with grouped-query attention (the blocks carry only the K/V heads);
- **Ulysses** runs four all-to-alls (q, k, v in, the output back), each keeping ``1/N`` of its
  tensor home: ``4 (N - 1) / N A``. About ``N / 2`` times fewer bytes than the ring (without GQA).

Bytes are not time. The ring's messages go to one neighbour and overlap the computation of
the block held, but only when computing a block takes at least as long as sending the next
(Liu et al. 2023, arXiv:2310.01889, section 3: a minimum block size set by FLOPS / bandwidth,
``min_block_for_overlap``); below it the ring waits on the network. Ulysses' all-to-alls
block the attention, reach every rank of the group (so they stay inside a node in practice),
and ``N`` may not exceed the heads (DeepSpeed lifted "dividing them" in 2024, PR #6392, uneven
heads).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.distributed as dist

from ddp_tutorial.context_parallel.ring_attention import RingAttention, qkv_inputs, shard_sequence
from ddp_tutorial.context_parallel.ulysses import ulysses_attention
from ddp_tutorial.env import rank_device

__all__ = ["ring_bytes", "ulysses_bytes", "counting_sends", "volume_worker", "ulysses_step_bytes",
           "min_block_for_overlap"]


def ring_bytes(n: int, activation: int, *, heads: int, kv_heads: int) -> int:
    """The ring's bytes sent per rank per forward: ``2 (N - 1) A kv_heads / heads``."""
    return 2 * (n - 1) * activation * kv_heads // heads


def ulysses_bytes(n: int, activation: int) -> int:
    """Ulysses' bytes sent to other ranks per rank per forward: ``4 (N - 1) / N A``."""
    return 4 * (n - 1) * activation // n


@contextmanager
def counting_sends() -> Iterator[dict[str, int]]:
    """Count the bytes this rank sends to *other* ranks through ``dist.batch_isend_irecv`` (the ring)
    and ``dist.all_to_all_single`` (Ulysses; the part a rank keeps for itself does not travel)."""
    sent = {"p2p": 0, "all_to_all": 0}
    batch, a2a = dist.batch_isend_irecv, dist.all_to_all_single

    def counted_batch(ops: list) -> list:
        sent["p2p"] += sum(op.tensor.numel() * op.tensor.element_size() for op in ops if op.op is dist.isend)
        return batch(ops)

    def counted_a2a(output: torch.Tensor, input: torch.Tensor, *args: object, **kwargs: object) -> object:  # noqa: A002  (torch's own parameter name)
        n = dist.get_world_size(kwargs.get("group"))
        sent["all_to_all"] += input.numel() * input.element_size() * (n - 1) // n  # equal splits
        return a2a(output, input, *args, **kwargs)

    dist.batch_isend_irecv, dist.all_to_all_single = counted_batch, counted_a2a
    try:
        yield sent
    finally:
        dist.batch_isend_irecv, dist.all_to_all_single = batch, a2a


def volume_worker(rank: int, world_size: int, shape: tuple[int, int, int, int], kv_heads: int) -> dict[str, int]:
    """One forward of the ring (with ``kv_heads`` K/V heads), of the ring with all heads, and of
    Ulysses: the bytes this rank sent in each, and ``A``, its local activation's bytes."""
    full = {kv: qkv_inputs(shape, torch.float32, kv_heads=kv) for kv in (kv_heads, shape[1])}
    mine = {kv: [shard_sequence(t, rank, world_size).to(rank_device()) for t in ts] for kv, ts in full.items()}
    result = {"A": mine[shape[1]][0].numel() * mine[shape[1]][0].element_size()}
    with torch.no_grad():
        for name, kv in (("ring, GQA", kv_heads), ("ring", shape[1])):
            with counting_sends() as sent:
                RingAttention.apply(*mine[kv], False, None, "contiguous")
            result[name] = sent["p2p"] + sent["all_to_all"]
        with counting_sends() as sent:
            ulysses_attention(*mine[shape[1]])
        result["Ulysses"] = sent["p2p"] + sent["all_to_all"]
    return result


def ulysses_step_bytes(rank: int, world_size: int, shape: tuple[int, int, int, int]) -> int:
    """Bytes this rank sends through Ulysses' all-to-alls in one forward *and* backward of attention over
    its shard of ``shape`` (float32): what ``performance.stepcomm.ulysses_cp_seconds`` counts."""
    q, k, v = (shard_sequence(t, rank, world_size).to(rank_device()).requires_grad_()
               for t in qkv_inputs(shape, torch.float32))
    with counting_sends() as sent:
        ulysses_attention(q, k, v).sum().backward()
    return sent["all_to_all"] + sent["p2p"]


def min_block_for_overlap(flops: float, bandwidth: float, *, heads: int, kv_heads: int,
                          element_bytes: int = 2) -> float:
    """The fewest positions per ring block for which computing it takes as long as sending the next.

    A block of ``c`` positions costs ``4 b h c^2 d`` FLOPs (``q k^T`` and ``p v``, forward) and
    sends ``2 b h_kv c d`` elements (K and V): compute ``>=`` transfer when
    ``c >= (flops / bandwidth) element_bytes h_kv / (2 h)``.
    """
    return flops / bandwidth * element_bytes * kv_heads / (2 * heads)
