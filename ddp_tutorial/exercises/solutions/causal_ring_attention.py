"""Exercise 20.2, reference solution: causal ring attention on the zig-zag layout, only the blocks the mask allows.

The sequence is cut into ``2N`` chunks of ``c`` positions; rank ``r`` holds chunks ``r`` and
``2N - 1 - r`` (an early one and a late one) of q, k and v, concatenated. The K/V blocks travel
around the ring as in 20.1; at hop ``h`` a rank holds the chunks of rank ``r - h``. Each pair of
a query chunk ``i`` and a key chunk ``j`` falls in one of three cases of the causal mask: ``j > i``,
every key after every query, skipped (no product at all); ``j == i``, the diagonal, the triangular
mask inside the chunk; ``j < i``, every key before every query, attended whole. Each pair's
result is merged into its query chunk's running output with the log-sum-exp rule.
``ddp_tutorial.context_parallel.ring_attention`` (``block_pairs``) has the same loop.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist


def causal_ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal attention (scale ``1/sqrt(head_dim)``) of this rank's queries, the sequence in the zig-zag layout.

    The whole sequence is cut into ``2N`` chunks of ``c`` positions. ``q``, ``k``, ``v``
    ``(batch, heads, 2c, head_dim)`` are this rank's two chunks, ``r`` then ``2N - 1 - r``,
    concatenated along the sequence (the lesson's ``shard_sequence(x, r, N, "zigzag")``). Return this
    rank's rows of ``scaled_dot_product_attention(q, k, v, is_causal=True)`` on the whole sequence,
    in the same order. K/V blocks travel around the ring with point-to-point messages (to
    ``rank + 1``, from ``rank - 1``; ``N - 1`` hops, no collectives). For each pair of a query
    chunk and a key chunk, compute only what the causal mask lets through: no product at all for
    a pair the mask hides entirely, and every product's result merged into the running one with
    the log-sum-exp rule, without ever holding the whole sequence's keys or scores. Scores may be
    large (about 100, in float32): never exponentiate one without subtracting an lse. Leave the
    arguments unchanged. Step by step: ``show("causal_ring_attention", hint=1)``, 2, 3.
    """
    rank, n = dist.get_rank(), dist.get_world_size()
    c = q.shape[2] // 2
    mine = (rank, 2 * n - 1 - rank)  # the global chunks of this rank's queries
    qs = q.split(c, dim=2)
    outs = [torch.zeros_like(x) for x in qs]
    lses = [torch.full(x.shape[:-1], float("-inf"), dtype=q.dtype, device=q.device) for x in qs]
    diagonal_mask = torch.ones(c, c, dtype=torch.bool, device=q.device).triu(1)  # a key after its query
    kv = torch.stack([k, v])  # one message per hop
    for hop in range(n):
        works = []
        if hop < n - 1:  # start the next block's trip before computing with this one
            arriving = torch.empty_like(kv)
            works = [dist.isend(kv, dst=(rank + 1) % n), dist.irecv(arriving, src=(rank - 1) % n)]
        sender = (rank - hop) % n
        held = (sender, 2 * n - 1 - sender)  # the global chunks of the K/V block held
        for a, i in enumerate(mine):
            for b, j in enumerate(held):
                if j > i:  # every key of chunk j comes after every query of chunk i
                    continue
                s = qs[a] @ kv[0, :, :, b * c:(b + 1) * c].transpose(-2, -1) / math.sqrt(q.shape[-1])
                if j == i:
                    s = s.masked_fill(diagonal_mask, float("-inf"))
                lse_b = torch.logsumexp(s, dim=-1)  # finite: a query always sees itself
                o_b = torch.exp(s - lse_b.unsqueeze(-1)) @ kv[1, :, :, b * c:(b + 1) * c]
                new = torch.logaddexp(lses[a], lse_b)
                outs[a] = outs[a] * torch.exp(lses[a] - new).unsqueeze(-1) + o_b * torch.exp(lse_b - new).unsqueeze(-1)
                lses[a] = new
        for work in works:
            work.wait()
        if hop < n - 1:
            kv = arriving
    return torch.cat(outs, dim=2)
