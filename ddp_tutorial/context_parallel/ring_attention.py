"""Ring attention from scratch: attention over a sequence split across ranks (``20_long_sequences``).

Each rank holds a slice of the sequence: its queries, keys and values ``(batch, heads,
seq/N, head_dim)``. A query needs *every* key, so the key/value blocks travel around the
ring: at step ``s`` rank ``r`` holds the block of rank ``r - s`` and sends it on to ``r + 1``
(``batch_isend_irecv``) while it computes attention of its queries with it. After ``N``
steps every query has met every key, and no rank ever held more than two K/V blocks.

The blocks' results are merged with the log-sum-exp rule (the online softmax of
FlashAttention, ``online_softmax``): a block gives its softmax-weighted values ``o_b`` and
``lse_b = log sum_j exp(s_j)`` of its scores; two blocks merge to ``lse = logaddexp(lse_a,
lse_b)`` and ``o = o_a exp(lse_a - lse) + o_b exp(lse_b - lse)``: exactly the softmax over both.
The running output, the lse and the gradients are kept in ``float32`` when the inputs are
bf16 or fp16. K and V may have fewer heads than q (grouped-query attention): the ring then
carries only the ``kv_heads``.

The backward is written too (an ``autograd.Function``): from the final ``lse`` each block's
probabilities are recomputed, the query gradient stays home, and the key/value gradients
travel around the ring beside their blocks and come home after ``N`` shifts (Liu et al.
2023, "Ring Attention with Blockwise Transformers for Near-Infinite Context",
arXiv:2310.01889; picotron's ``context_parallel``). With ``causal=True`` a rank skips the
blocks of later ranks, so rank 0 works least: ``zigzag`` balances that.

    torchrun --nproc-per-node=4 -m ddp_tutorial.context_parallel.ring_attention   # N = 4, causal and not
    python -m ddp_tutorial.context_parallel.ring_attention                         # N = 1: one block
"""

from __future__ import annotations

import argparse
import math

import torch
import torch.distributed as dist

from ddp_tutorial.context_parallel.online_softmax import (
    ACCUMULATE,
    attend_block,
    fold_kv,
    merge_partials,
    repeat_kv,
    scores,
)
from ddp_tutorial.env import distributed, rank_device
from ddp_tutorial.launch.verdict import verdict

__all__ = ["LAYOUTS", "chunk_ids", "block_pairs", "ring_shift",
           "RingAttention", "ring_attention", "shard_sequence", "unshard_sequence", "ring_case", "ring_worker",
           "loss_weight", "qkv_inputs",
           "reference_attention", "compare", "tolerance", "main"]

LAYOUTS = ("contiguous", "zigzag")


def chunk_ids(rank: int, world_size: int, layout: str = "contiguous") -> list[int]:
    """The global sequence chunks rank ``rank`` holds, in its local order.

    ``contiguous``: the sequence in ``N`` chunks, rank ``r`` holds chunk ``r``. ``zigzag``: in
    ``2N`` chunks, rank ``r`` holds ``r`` and ``2N - 1 - r`` (an early and a late one).
    """
    if layout == "contiguous":
        return [rank]
    if layout == "zigzag":
        return [rank, 2 * world_size - 1 - rank]
    raise ValueError(f"layout {layout!r}: one of {', '.join(LAYOUTS)}")


def block_pairs(q_chunks: list[int], kv_chunks: list[int], *, causal: bool) -> list[tuple[int, int, bool]]:
    """(local query chunk, local key chunk, diagonal?) for every pair that has any unmasked score.

    Causal: a key chunk after the query chunk is skipped whole, the same chunk is the
    diagonal (a triangular mask), an earlier one is attended to whole.
    """
    pairs = []
    for a, i in enumerate(q_chunks):
        for b, j in enumerate(kv_chunks):
            if not causal or j < i:
                pairs.append((a, b, False))
            elif j == i:
                pairs.append((a, b, True))
    return pairs


def ring_shift(tensor: torch.Tensor, group: dist.ProcessGroup | None = None) -> tuple[torch.Tensor, list]:
    """Start sending ``tensor`` to the next rank and receiving the previous rank's: (inbox, works).

    One ``batch_isend_irecv``: on NCCL a lone send to a peer that first sends too can wait for
    ever; batched, the pair is launched together. Wait on the works before reading the inbox.
    """
    rank, n = dist.get_rank(group), dist.get_world_size(group)
    peer = (lambda r: r) if group is None else (lambda r: dist.get_global_rank(group, r))
    inbox = torch.empty_like(tensor)
    ops = [dist.P2POp(dist.isend, tensor, peer((rank + 1) % n), group=group),
           dist.P2POp(dist.irecv, inbox, peer((rank - 1) % n), group=group)]
    return inbox, dist.batch_isend_irecv(ops)


def wait(works: list) -> None:
    for work in works:
        work.wait()


class RingAttention(torch.autograd.Function):
    """Ring attention's forward and backward, for any layout of sequence chunks over the ranks."""

    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                group: dist.ProcessGroup | None, layout: str) -> torch.Tensor:
        rank, n = dist.get_rank(group), dist.get_world_size(group)
        mine = chunk_ids(rank, n, layout)
        qs = q.chunk(len(mine), dim=2)
        acc = torch.promote_types(q.dtype, ACCUMULATE)  # bf16 in: the running sums in float32
        out = torch.zeros(q.shape, dtype=acc, device=q.device)
        lse = torch.full(q.shape[:-1], float("-inf"), dtype=acc, device=q.device)
        outs, lses = out.chunk(len(mine), dim=2), lse.chunk(len(mine), dim=2)  # views: merged in place
        kv = torch.stack([k, v]).contiguous()
        for step in range(n):
            works = []
            if step < n - 1:  # the next block travels while this one is computed
                incoming, works = ring_shift(kv, group)
            held = chunk_ids((rank - step) % n, n, layout)
            ks, vs = kv[0].chunk(len(held), dim=2), kv[1].chunk(len(held), dim=2)
            for a, b, diagonal in block_pairs(mine, held, causal=causal):
                o_b, lse_b = attend_block(qs[a], ks[b], vs[b], diagonal=diagonal)
                o, m = merge_partials(outs[a], lses[a], o_b, lse_b)
                outs[a].copy_(o)
                lses[a].copy_(m)
            wait(works)
            if step < n - 1:
                kv = incoming
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.causal, ctx.group, ctx.layout = causal, group, layout
        return out.to(q.dtype)

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        q, k, v, out, lse = ctx.saved_tensors
        dtype, kv_heads = q.dtype, k.shape[1]
        q, k, v, grad_out = (t.to(out.dtype) for t in (q, k, v, grad_out))  # gradients summed in float32
        group, causal, layout = ctx.group, ctx.causal, ctx.layout
        rank, n = dist.get_rank(group), dist.get_world_size(group)
        mine = chunk_ids(rank, n, layout)
        parts = len(mine)
        delta = (grad_out * out).sum(-1)  # D = rowsum(dO * O): softmax's backward needs it per query
        dq = torch.zeros_like(q)
        qs, dos, lses, deltas, dqs = (t.chunk(parts, dim=2) for t in (q, grad_out, lse, delta, dq))
        kv = torch.stack([k, v]).contiguous()
        dkv = torch.zeros_like(kv)  # the gradient of the block held: travels with it, home after n shifts
        for step in range(n):
            works = []
            if step < n - 1:
                incoming, works = ring_shift(kv, group)
            held = chunk_ids((rank - step) % n, n, layout)
            ks, vs = kv[0].chunk(len(held), dim=2), kv[1].chunk(len(held), dim=2)
            dks, dvs = dkv[0].chunk(len(held), dim=2), dkv[1].chunk(len(held), dim=2)
            for a, b, diagonal in block_pairs(mine, held, causal=causal):
                p = torch.exp(scores(qs[a], ks[b], diagonal) - lses[a].unsqueeze(-1))  # the final softmax
                dvs[b].add_(fold_kv(p.transpose(-2, -1) @ dos[a], kv_heads))
                vb = repeat_kv(vs[b], q.shape[1])
                ds = p * (dos[a] @ vb.transpose(-2, -1) - deltas[a].unsqueeze(-1)) / math.sqrt(q.shape[-1])
                dqs[a].add_(ds @ repeat_kv(ks[b], q.shape[1]))
                dks[b].add_(fold_kv(ds.transpose(-2, -1) @ qs[a], kv_heads))
            wait(works)
            if step < n - 1:
                kv = incoming
            if n > 1:  # this block's gradient follows it to the next rank (after the last step: home)
                dkv, works = ring_shift(dkv, group)
                wait(works)
        return dq.to(dtype), dkv[0].to(dtype), dkv[1].to(dtype), None, None, None


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
                   group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Attention of this rank's contiguous sequence shard ``(batch, heads, seq/N, head_dim)`` with the
    whole sequence, the K/V blocks passed around ``group``'s ring; differentiable.

    Equals ``scaled_dot_product_attention(q, k, v, is_causal=causal)`` on the full sequence,
    cut to this rank's rows (``shard_sequence``).
    """
    return RingAttention.apply(q, k, v, causal, group, "contiguous")


def shard_sequence(x: torch.Tensor, rank: int, world_size: int, layout: str = "contiguous",
                   dim: int = 2) -> torch.Tensor:
    """Rank ``rank``'s part of the whole sequence ``x`` along ``dim``, its chunks in ``chunk_ids`` order."""
    ids = chunk_ids(rank, world_size, layout)
    total = world_size * len(ids)
    if x.shape[dim] % total:
        raise ValueError(f"a sequence of {x.shape[dim]} does not split into {total} equal chunks")
    pieces = x.chunk(total, dim=dim)
    return torch.cat([pieces[i] for i in ids], dim=dim)


def unshard_sequence(parts: list[torch.Tensor], layout: str = "contiguous", dim: int = 2) -> torch.Tensor:
    """The whole sequence back from every rank's part (``parts[r]`` is rank ``r``'s), in order."""
    n = len(parts)
    by_chunk = {}
    for rank, part in enumerate(parts):
        ids = chunk_ids(rank, n, layout)
        by_chunk.update(zip(ids, part.chunk(len(ids), dim=dim)))
    return torch.cat([by_chunk[i] for i in sorted(by_chunk)], dim=dim)


def loss_weight(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """The random ``w`` of the loss ``(out * w).sum()``: every query's gradient differs."""
    return torch.randn(shape, generator=torch.Generator().manual_seed(1), dtype=dtype)


def reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool) -> dict:
    """torch's ``scaled_dot_product_attention`` on the whole sequence in one process: the output, and
    the gradients of ``(out * loss_weight).sum()``, the loss every rank's shard uses too."""
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    heads = q.shape[1]  # grouped-query attention: each K/V head repeated for its query heads
    out = torch.nn.functional.scaled_dot_product_attention(q, repeat_kv(k, heads), repeat_kv(v, heads), is_causal=causal)
    (out * loss_weight(out.shape, out.dtype)).sum().backward()
    return {"out": out.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad}


def qkv_inputs(shape: tuple[int, int, int, int], dtype: torch.dtype, seed: int = 0, *,
               kv_heads: int | None = None) -> list[torch.Tensor]:
    """The whole sequence's q, k, v ``(batch, heads, seq, head_dim)`` from ``seed``: every rank draws the same.

    ``kv_heads``: k and v get that many heads (grouped-query attention); q keeps ``heads``.
    """
    gen = torch.Generator().manual_seed(seed)
    b, h, s, d = shape
    kv_shape = (b, kv_heads or h, s, d)
    return [torch.randn(size, generator=gen, dtype=dtype) for size in (shape, kv_shape, kv_shape)]


def tolerance(dtype: torch.dtype) -> float:
    """How far a sum taken in other blocks may land from SDPA's, for values of order 1.

    float32: 1e-5, about 84 ulps at 1 (an ulp there is 1.19e-7); float64: 1e-12, about 4,500 ulps
    (2.2e-16). Sums over 24 keys in another order land well inside (seen about 1e-6 and 1e-15).
    """
    return {torch.float32: 1e-5, torch.float64: 1e-12}[dtype]


def ring_case(rank: int, world_size: int, shape: tuple[int, int, int, int], *, causal: bool = False,
              dtype: torch.dtype = torch.float32, layout: str = "contiguous", kv_heads: int | None = None) -> dict:
    """Ring attention of this rank's shard, forward and backward of the loss ``reference_attention`` uses.

    Returns this rank's output and q/k/v gradients (on the CPU) for the parent to stitch and compare.
    """
    device = rank_device()
    full = qkv_inputs(shape, dtype, kv_heads=kv_heads)
    q, k, v = (shard_sequence(t, rank, world_size, layout).to(device).requires_grad_() for t in full)
    out = RingAttention.apply(q, k, v, causal, None, layout)
    w = loss_weight(shape, dtype)  # the same loss as the one process's: (out * w).sum()
    (out * shard_sequence(w, rank, world_size, layout).to(device)).sum().backward()
    return {"rank": rank, "out": out.detach().cpu(), "dq": q.grad.cpu(), "dk": k.grad.cpu(), "dv": v.grad.cpu()}


def ring_worker(rank: int, world_size: int, cases: list[dict]) -> list[dict]:
    """``ring_case`` for each of ``cases`` (its keyword arguments: ``shape``, ``causal``, ``dtype``,
    ``layout``, ``kv_heads``), in one launch."""
    return [ring_case(rank, world_size, **case) for case in cases]


def compare(results: list[dict], full: list[torch.Tensor], *, causal: bool, layout: str = "contiguous") -> dict:
    """The largest difference of the stitched outputs and gradients to SDPA on the whole sequence."""
    want = reference_attention(*full, causal=causal)
    return {key: (unshard_sequence([r[key] for r in results], layout) - want[key]).abs().max().item()
            for key in ("out", "dq", "dk", "dv")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq", type=int, default=24, help="sequence length, a multiple of 2 x world size")
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    shape = (2, 2, args.seq, 8)
    with distributed() as (info, _):
        for causal in (False, True):
            result = ring_case(info.rank, info.world_size, shape, causal=causal, dtype=dtype)
            results = [None] * info.world_size
            dist.all_gather_object(results, result)
            if info.is_main:
                diff = compare(results, qkv_inputs(shape, dtype), causal=causal)
                ok = max(diff.values()) < tolerance(dtype)
                verdict(ok, f"ring attention over {info.world_size} rank(s), causal={causal}, "
                            f"{args.dtype}: output and q/k/v gradients equal SDPA on the whole sequence "
                            f"(largest difference {max(diff.values()):.1e})")


if __name__ == "__main__":
    main()
