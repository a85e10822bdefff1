"""Attention in blocks of keys and the log-sum-exp merge: the online softmax (``20_long_sequences``).

A block of keys gives its softmax-weighted values ``o_b`` and ``lse_b = log sum_j exp(s_j)`` of
its scores per query. Two blocks merge exactly into the softmax over both:
``lse = logaddexp(lse_a, lse_b)`` and ``o = o_a exp(lse_a - lse) + o_b exp(lse_b - lse)``.
``merge_partials`` writes the same rule in its numerically stable form,
``o = o_a - sigmoid(lse_b - lse_a) (o_a - o_b)`` (ring-flash-attention PR #34, picotron's
``update_out_and_lse``): no ``exp`` of a large difference is ever taken, and it accumulates in
``float32`` whatever the inputs are (torch's own context parallelism does the same,
``convert_to_f32``). A query whose keys in a block are all masked gets ``lse_b = -inf`` and
``o_b = 0``, and the merge leaves it as it was.

Keys and values may have fewer heads than the queries (grouped-query attention): each K/V head
serves ``heads / kv_heads`` query heads (``repeat_kv``).
"""

from __future__ import annotations

import math

import torch

__all__ = ["repeat_kv", "fold_kv", "scores", "attend_block", "merge_partials", "ACCUMULATE"]

ACCUMULATE = torch.float32  # the running output and lse, whatever the inputs' dtype (if not float64)


def repeat_kv(x: torch.Tensor, heads: int) -> torch.Tensor:
    """``(b, kv_heads, s, d)`` -> ``(b, heads, s, d)``: K/V head ``j`` serves query heads ``j g .. (j+1) g``."""
    kv_heads = x.shape[1]
    if heads % kv_heads:
        raise ValueError(f"{heads} query heads do not share {kv_heads} K/V heads equally")
    return x if kv_heads == heads else x.repeat_interleave(heads // kv_heads, dim=1)


def fold_kv(grad: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """``repeat_kv``'s backward: the gradients of the query heads that share a K/V head, summed."""
    b, heads, s, d = grad.shape
    return grad if heads == kv_heads else grad.view(b, kv_heads, heads // kv_heads, s, d).sum(2)


def scores(q: torch.Tensor, k: torch.Tensor, diagonal: bool) -> torch.Tensor:
    """``q k^T / sqrt(d)`` in at least ``float32`` (as fused kernels keep them), the diagonal block's
    future keys at ``-inf``."""
    acc = torch.promote_types(q.dtype, ACCUMULATE)
    s = q.to(acc) @ repeat_kv(k, q.shape[1]).to(acc).transpose(-2, -1) / math.sqrt(q.shape[-1])
    if diagonal:
        future = torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).triu(1)
        s = s.masked_fill(future, float("-inf"))
    return s


def attend_block(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                 diagonal: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """One block's attention: its softmax-weighted values (``q``'s dtype) and the log-sum-exp of its
    scores per query (at least ``float32``, as fused kernels return it)."""
    s = scores(q, k, diagonal)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse.nan_to_num(neginf=0.0).unsqueeze(-1))  # a fully masked row: p = 0, not NaN
    return p.to(q.dtype) @ repeat_kv(v, q.shape[1]), lse


def merge_partials(out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor,
                   lse_b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Two blocks' attention over disjoint keys merged into attention over both (the online softmax).

    The result has ``out_a``'s dtype: keep ``out_a`` in ``float32`` when the blocks are bf16.
    ``lse_a = -inf`` means nothing seen yet, ``lse_b = -inf`` a block whose keys are all masked.
    """
    weight = torch.sigmoid(lse_b - lse_a).nan_to_num(nan=0.0)  # exp(lse_b - lse): both -inf gives 0
    lse = torch.logaddexp(lse_a, lse_b)
    out = out_a - weight.unsqueeze(-1).to(out_a.dtype) * (out_a - out_b.to(out_a.dtype))
    return out, lse
