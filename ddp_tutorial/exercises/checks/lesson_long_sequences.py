"""Lesson 20's exercises: ring attention's forward (20.1) and its causal zig-zag form (20.2, checked in ``causal_ring``).

20.1 builds the forward from point-to-point messages and the log-sum-exp merge. The reference is
torch's ``scaled_dot_product_attention`` on the whole sequence, in one process, in float64: the
checker draws the whole q, k, v from a seed on every rank and gives each rank its contiguous
slice. Every message is recorded (``traced``): K/V only to the right neighbour and from the left
one, ``N - 1`` hops' worth of elements; collectives are refused (the exercise asks for the ring),
and so are the classic wrong merges. A ``TorchDispatchMode`` (``attention_checks``, shared with
20.2) watches every tensor the learner's call makes: one whose last two dimensions reach the whole
sequence (all the keys, or all the scores, held at once) fails, whatever the result. A float32
case with scores near 100 overflows ``exp`` unless a running maximum (the lse) is kept.
"""

from __future__ import annotations

import torch

from ddp_tutorial.exercises.checks.attention_checks import SCALE, Shape, WholeSequence, close, ring_worker
from ddp_tutorial.exercises.checks.causal_ring import causal_ring_attention_worker
from ddp_tutorial.exercises.exercise import Exercise
from ddp_tutorial.exercises.harness import Report


def whole(shape: Shape, world_size: int, seed: int) -> list[torch.Tensor]:
    b, h, s, d = shape
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(b, h, s * world_size, d, generator=gen, dtype=torch.float64) for _ in range(3)]


def blocks(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each rank's K/V block's (softmax-weighted values, log-sum-exp) for these queries."""
    out = []
    for kb, vb in zip(k.chunk(n, dim=2), v.chunk(n, dim=2)):
        s = q @ kb.transpose(-2, -1) / q.shape[-1] ** 0.5
        lse = torch.logsumexp(s, dim=-1)
        out.append((torch.exp(s - lse.unsqueeze(-1)) @ vb, lse))
    return out


def explain(got: object, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rank: int, n: int) -> str | None:
    """None if ``got`` is this rank's rows of SDPA on the whole sequence; else what it is instead."""
    q, k, v = (t.double() for t in (q, k, v))  # the reference in float64 whatever the case's dtype
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    if not isinstance(got, torch.Tensor):
        return f"returned {type(got).__name__}, not the output tensor"
    got = got.detach().cpu()
    if got.shape != want.shape:
        return f"the output has shape {tuple(got.shape)}, expected {tuple(want.shape)}: the same as q"
    if close(got, want):
        return None
    if not torch.isfinite(got).all():
        return ("the output holds inf or NaN on scores near 100 in float32: exp(100) overflows. Keep each "
                "block's lse = logsumexp(s) (a running maximum) and exponentiate s - lse, never s itself")
    parts = blocks(q, k, v, n)
    if n > 1 and close(got, parts[rank][0]):
        return ("the output is attention over this rank's own keys only: the other ranks' K/V blocks never "
                "arrived, or were not merged in (N - 1 hops around the ring)")
    if n > 1 and close(got, sum(o for o, _ in parts) / n):
        return ("the output is the plain mean of the blocks' outputs: each block must count by its share of "
                "the softmax's mass, exp(lse_b - lse) with lse = logaddexp over the blocks")
    if n > 1 and close(got, sum(o for o, _ in parts)):
        return ("the output is the sum of the blocks' outputs, each normalised over its own keys: rescale "
                "each by exp(lse_b - lse), where lse is the log-sum-exp over all blocks")
    diff = (got - want).abs()
    return (f"the output differs from SDPA on the whole sequence by up to {diff.max().item():.3g}; is each "
            "block's lse = logsumexp(q k^T / sqrt(d)) and the running output rescaled when lse grows?")


def ring_attention_forward_worker(rank: int, world_size: int, source: str, function: str, trace_dir: str) -> Report:
    """Each shape in ``attention_checks.SHAPES`` (and ``LARGE`` in float32) against SDPA on the whole sequence."""

    def inputs(shape: Shape, seed: int, dtype: torch.dtype) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        q, k, v = whole(shape, world_size, seed)
        if dtype != torch.float64:
            q, k, v = (q * SCALE).to(dtype), k.to(dtype), v.to(dtype)
        return [q, k, v], [t.chunk(world_size, dim=2)[rank] for t in (q, k, v)]

    def judge(got: object, qkv: list[torch.Tensor], mine: list[torch.Tensor], watch: WholeSequence,
              shape: Shape) -> str | None:
        return explain(got, mine[0], qkv[1], qkv[2], rank, world_size)

    return ring_worker(rank, world_size, source, function, trace_dir, inputs=inputs, judge=judge,
                       watch=lambda shape: WholeSequence(shape[2] * world_size))


EXERCISES = [
    Exercise(
        name="ring_attention_forward", number="20.1", lesson=20, notebook="20_long_sequences.ipynb",
        title="ring attention's forward: K/V around the ring, the log-sum-exp merge", level="hard",
        task=("Compute attention of this rank's slice of the sequence with the whole sequence's keys, "
              "passing the K/V blocks around the ring (N - 1 hops) and merging each block's result into "
              "the running one with the log-sum-exp rule."),
        hint=("Per hop: post an isend of the block you hold to rank + 1 and an irecv from rank - 1, compute "
              "with the block you hold, then wait; the block that arrived is the one you compute with next."),
        more_hints=("A block's result is the softmax over its keys only. Keep its log-sum-exp per query too: it "
                    "says how much of the whole softmax's mass that block holds, and lets the running output "
                    "be rescaled when a later block brings more.",
                    "s = q @ k_b.transpose(-2, -1) / sqrt(d); lse_b = logsumexp(s, -1); "
                    "o_b = exp(s - lse_b) @ v_b. Start with out = 0 and lse = -inf; new = logaddexp(lse, lse_b); "
                    "out = out * exp(lse - new) + o_b * exp(lse_b - new); lse = new."),
        checks=("three shapes in float64 (one position per rank among them) and one in float32 with scores "
                "near 100 (no running maximum overflows), compared with "
                "scaled_dot_product_attention on the whole sequence in one process; no tensor as long as the "
                "whole sequence in its last two dimensions (all the keys or scores at once); messages only to the "
                "right neighbour and from the left one, N - 1 hops of one K and one V block; collectives "
                "refused; the arguments unchanged; ddp_tutorial.context_parallel is refused"),
        worker=ring_attention_forward_worker),
    Exercise(
        name="causal_ring_attention", number="20.2", lesson=20, notebook="20_long_sequences.ipynb",
        title="causal ring attention on the zig-zag layout: the diagonal blocks and the blocks to skip",
        level="hard",
        task=("Compute causal attention of this rank's two chunks of the sequence (the zig-zag layout: chunks r "
              "and 2N - 1 - r of 2N) with the whole sequence's keys, passing the K/V blocks around the ring and "
              "computing, for each pair of a query chunk and a key chunk, only what the causal mask lets through."),
        hint=("Name every chunk by its global index: your queries are chunks r and 2N - 1 - r, and the block that "
              "arrives at hop h is rank (r - h)'s, chunks r - h and 2N - 1 - (r - h) (mod N). The causal mask "
              "compares positions, so each pair of a query chunk i and a key chunk j is one of three cases."),
        more_hints=("j > i: every key comes after every query, the pair contributes nothing (no product at all). "
                    "j == i: the diagonal, the same positions on both sides, a triangular mask inside the chunk. "
                    "j < i: every key comes before every query, the pair is attended whole. Each query chunk keeps "
                    "its own running output and lse, merged as in 20.1.",
                    "With c = seq per chunk: q chunk a is q[:, :, a c:(a + 1) c], likewise the held block's chunk b. "
                    "Diagonal: s = s.masked_fill(triu(ones(c, c), 1), -inf) before lse_b = logsumexp(s, -1). "
                    "Merge: new = logaddexp(lse_a, lse_b); out_a = out_a exp(lse_a - new) + o_b exp(lse_b - new). "
                    "Return the two chunks' outputs concatenated, in q's order."),
        checks=("three shapes in float64 (one position per chunk among them) and one in float32 with scores near "
                "100 (no running maximum overflows), compared with scaled_dot_product_attention(is_causal=True) on "
                "the whole sequence in one process, placed zig-zag; the matrix products each rank computes (mm, "
                "bmm, attention kernels) at most the 2N + 1 chunk pairs the causal mask leaves it (a pair hidden "
                "entirely must be skipped, not masked); no tensor as long as the whole sequence; messages only "
                "to the right neighbour and from the left one, N - 1 hops of one K and one V block; collectives "
                "refused; the arguments unchanged; ddp_tutorial.context_parallel is refused"),
        world_sizes=(1, 2, 3, 4), worker=causal_ring_attention_worker),
]
