"""Exercise 20.1, reference solution: ring attention's forward, K/V blocks around the ring, merged by log-sum-exp.

Each rank holds a contiguous slice of the sequence: its queries and the keys and values of
the same positions. A query needs every key, so the K/V blocks travel: at each of ``N - 1``
hops every rank sends the block it holds to ``rank + 1`` and receives ``rank - 1``'s (an
``isend`` and an ``irecv`` posted together: no deadlock), while it computes attention of its
queries with the block it holds. Each block gives a partial answer: ``o_b = softmax(s_b) v_b``
over its keys only, and ``lse_b = logsumexp(s_b)`` per query. The softmax over all keys
weights each block by its share of the total ``exp`` mass: ``lse = logaddexp(lse, lse_b)``,
``o = o exp(old lse - lse) + o_b exp(lse_b - lse)``. After the last block nothing is sent on.
``ddp_tutorial.context_parallel.ring_attention`` has the same loop (with the backward).
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist


def ring_attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Attention (no mask, scale ``1/sqrt(head_dim)``) of this rank's queries with the whole sequence's keys.

    ``q``, ``k``, ``v`` ``(batch, heads, seq/N, head_dim)`` are this rank's contiguous slice of
    the sequence: rank ``r`` holds positions ``r seq/N .. (r+1) seq/N``. Return this rank's rows
    of ``scaled_dot_product_attention`` on the whole sequence, computed block by block: K/V
    blocks passed around the ring with point-to-point messages (to ``rank + 1``, from
    ``rank - 1``; ``N - 1`` hops, no collectives), each block's result merged into the running
    one with the log-sum-exp rule, without ever holding the whole sequence's keys or scores. Scores
    may be large (about 100, in float32): never exponentiate one without subtracting an lse. Leave the
    arguments unchanged. The merge's formulas, step by step: ``show("ring_attention_forward", hint=1)``, 2, 3.
    """
    rank, n = dist.get_rank(), dist.get_world_size()
    out = torch.zeros_like(q)
    lse = torch.full(q.shape[:-1], float("-inf"), dtype=q.dtype, device=q.device)
    kv = torch.stack([k, v])  # one message per hop
    for hop in range(n):
        works = []
        if hop < n - 1:  # start the next block's trip before computing with this one
            arriving = torch.empty_like(kv)
            works = [dist.isend(kv, dst=(rank + 1) % n), dist.irecv(arriving, src=(rank - 1) % n)]
        s = q @ kv[0].transpose(-2, -1) / math.sqrt(q.shape[-1])
        lse_b = torch.logsumexp(s, dim=-1)
        o_b = torch.exp(s - lse_b.unsqueeze(-1)) @ kv[1]
        new = torch.logaddexp(lse, lse_b)
        out = out * torch.exp(lse - new).unsqueeze(-1) + o_b * torch.exp(lse_b - new).unsqueeze(-1)
        lse = new
        for work in works:
            work.wait()
        if hop < n - 1:
            kv = arriving
    return out
