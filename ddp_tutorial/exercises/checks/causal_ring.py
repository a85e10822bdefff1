"""Exercise 20.2's checker: causal ring attention on the zig-zag layout, judged by what each rank computes.

The reference is torch's ``scaled_dot_product_attention(is_causal=True)`` on the whole sequence,
in one process, in float64, re-placed with the lesson's ``shard_sequence(..., "zigzag")``: rank
``r`` gets chunks ``r`` and ``2N - 1 - r`` of ``2N``. Besides the numbers (and a float32 case with
scores near 100, where a merge without a running maximum overflows), a ``TorchDispatchMode``
counts the multiply-adds of every matrix product the learner's call makes (``mm``, ``bmm``, and
torch's attention kernels): the causal mask leaves ``2N + 1`` chunk pairs to a rank (two diagonal
ones and ``2N - 1`` in the past), each ``q k^T`` and ``p v`` of ``c x c`` keys; more means a pair
hidden entirely by the mask was computed and masked away. The same mode refuses a tensor as
long as the whole sequence (``attention_checks``), and the messages are 20.1's ring.
"""

from __future__ import annotations

import torch

from ddp_tutorial.context_parallel.ring_attention import shard_sequence
from ddp_tutorial.exercises.checks.attention_checks import SCALE, Shape, WholeSequence, close, ring_worker
from ddp_tutorial.exercises.harness import Report

PRODUCTS = ("mm", "bmm", "addmm", "baddbmm")


class Work(WholeSequence):
    """``WholeSequence``, and the multiply-adds of every matrix product and attention kernel seen."""

    def __init__(self, whole: int):
        super().__init__(whole)
        self.flops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001  (torch's protocol)
        name = func.overloadpacket.__name__
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        if name in PRODUCTS:  # (..., m, k) @ (..., k, n): 2 m k n per matrix
            a, b = tensors[-2:]
            self.flops += 2 * a.numel() * b.shape[-1]
        elif "scaled_dot_product" in name:  # q k^T and p v in one kernel, counted whole (mask or not)
            q, k = tensors[:2]
            self.flops += 4 * q.numel() * k.shape[-2]
        return super().__torch_dispatch__(func, types, args, kwargs)


def whole(shape: Shape, world_size: int, seed: int) -> list[torch.Tensor]:
    b, h, c, d = shape
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(b, h, 2 * c * world_size, d, generator=gen, dtype=torch.float64) for _ in range(3)]


def masked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """Softmax attention where ``allowed[p, t]`` says query ``p`` sees key ``t`` (float64, one process)."""
    s = (q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5).masked_fill(~allowed, float("-inf"))
    return torch.softmax(s, dim=-1) @ v


def look_alikes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rank: int, n: int) -> list[tuple[torch.Tensor, str]]:
    """This rank's rows of the classic wrong answers, each with its diagnosis."""
    seq = q.shape[2]
    c = seq // (2 * n)
    p, t = torch.arange(seq).unsqueeze(1), torch.arange(seq).unsqueeze(0)
    mine = torch.tensor([rank, 2 * n - 1 - rank])
    own = torch.isin(t // c, mine)
    zig = [shard_sequence(x, r, n, "zigzag") for x in (q, k, v) for r in range(n)]
    placed = [torch.cat(zig[i * n:(i + 1) * n], dim=2) for i in range(3)]  # the ranks' parts end to end
    contiguous = torch.nn.functional.scaled_dot_product_attention(*placed, is_causal=True)
    return [
        (contiguous[:, :, rank * 2 * c:(rank + 1) * 2 * c],
         f"the output is causal attention as if rank {rank} held the contiguous positions {rank * 2 * c} to "
         f"{(rank + 1) * 2 * c - 1} (the contiguous placement): in the zig-zag layout it holds chunks {rank} and "
         f"{2 * n - 1 - rank} of {2 * n}, and the K/V block from rank s holds chunks s and 2N - 1 - s"),
        (shard_sequence(masked(q, k, v, t // c <= p // c), rank, n, "zigzag"),
         "the diagonal blocks (a query chunk with its own key chunk) were attended unmasked: there a query "
         "sees only the keys at or before its own position, the triangular mask"),
        (shard_sequence(masked(q, k, v, (t // c <= p // c) & (t % c <= p % c)), rank, n, "zigzag"),
         "the triangular mask was applied with positions inside each block (local) instead of global ones: "
         "a key chunk before the query chunk is seen whole, only the diagonal block is masked"),
        (shard_sequence(masked(q, k, v, t <= p), rank, n, "zigzag") if n == 1 else
         shard_sequence(masked(q, k, v, (t <= p) & own), rank, n, "zigzag"),
         "the output is causal attention over this rank's own keys only: the other ranks' K/V blocks never "
         "arrived, or were not merged in (N - 1 hops around the ring)"),
        (shard_sequence(torch.nn.functional.scaled_dot_product_attention(q, k, v), rank, n, "zigzag"),
         "the output is attention without the causal mask: each query sees only the keys at or before it"),
    ]


def explain(got: object, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rank: int, n: int) -> str | None:
    """None if ``got`` is this rank's zig-zag rows of causal SDPA on the whole sequence; else what it is."""
    want = shard_sequence(torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True), rank, n, "zigzag")
    if not isinstance(got, torch.Tensor):
        return f"returned {type(got).__name__}, not the output tensor"
    got = got.detach().cpu()
    if got.shape != want.shape:
        return f"the output has shape {tuple(got.shape)}, expected {tuple(want.shape)}: the same as q"
    if close(got, want):
        return None
    if not torch.isfinite(got).all():
        if got.dtype != torch.float64:
            return ("the output holds inf or NaN on scores near 100 in float32: exp(100) overflows. Keep each "
                    "block's lse = logsumexp(s) (a running maximum) and exponentiate s - lse, never s itself")
        return ("the output holds NaN: a block whose keys are all masked for a query gives lse = -inf and "
                "exp(-inf - (-inf)) = NaN. A key chunk entirely after the query chunk needs no product at all")
    seen = [what for candidate, what in look_alikes(q, k, v, rank, n) if close(got, candidate)]
    if seen:  # two mistakes can give one rank the same rows (rank 0's own keys are its contiguous prefix)
        return "; or, which gives this rank the same rows, ".join(seen)
    c = q.shape[2] // (2 * n)
    wrong = [i for i, (g, w) in zip((rank, 2 * n - 1 - rank), zip(got.split(c, 2), want.split(c, 2))) if not close(g, w)]
    return (f"the rows of chunk {wrong[0]} (of {2 * n}) differ from causal SDPA on the whole sequence by up to "
            f"{(got - want).abs().max().item():.3g}; is the mask built from global positions (chunk index x c + "
            "offset), each pair of chunks taken as skipped, diagonal or whole, and merged with the log-sum-exp rule?")


def too_much(flops: int, shape: Shape, n: int) -> str | None:
    """None if ``flops`` is no more than the ``2N + 1`` chunk pairs the causal mask leaves to a rank."""
    b, h, c, d = shape
    pair = 4 * b * h * c * c * d  # q k^T and p v of one query chunk with one key chunk
    if flops <= (2 * n + 1) * pair:
        return None
    return (f"the output is right, but it computes the blocks the causal mask hides entirely: its matrix products "
            f"came to {flops / pair:g} chunk pairs' worth (q k^T and p v, c x c), where the mask leaves 2N + 1 = "
            f"{2 * n + 1} (two diagonal ones, {2 * n - 1} in the past). A key chunk after the query chunk (j > i) "
            "needs no product at all: skip it rather than mask it")


def causal_ring_attention_worker(rank: int, world_size: int, source: str, function: str, trace_dir: str) -> Report:
    """Each shape in ``attention_checks.SHAPES`` (and ``LARGE`` in float32) against causal SDPA, re-placed zig-zag."""

    def inputs(shape: Shape, seed: int, dtype: torch.dtype) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        q, k, v = whole(shape, world_size, seed)
        if dtype != torch.float64:
            q, k, v = (q * SCALE).to(dtype).double(), k.to(dtype).double(), v.to(dtype).double()
        return [q, k, v], [shard_sequence(t, rank, world_size, "zigzag").to(dtype) for t in (q, k, v)]

    def judge(got: object, qkv: list[torch.Tensor], mine: list[torch.Tensor], watch: WholeSequence,
              shape: Shape) -> str | None:
        return explain(got, *qkv, rank, world_size) or too_much(watch.flops, shape, world_size)

    return ring_worker(rank, world_size, source, function, trace_dir, inputs=inputs, judge=judge,
                       watch=lambda shape: Work(2 * shape[2] * world_size), per_rank="two chunks of ")
