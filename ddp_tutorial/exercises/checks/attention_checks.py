"""What lesson 20's two checkers share (20.1 ``ring_attention_forward``, 20.2 ``causal_ring_attention``).

The refusal of collectives (the exercises ask for the ring), the ``TorchDispatchMode`` that sees a
tensor as long as the whole sequence (all the keys, or all the scores, held at once on one rank),
the closeness rule against a float64 reference, the ring's messages (K/V only to the right
neighbour and from the left one, ``N - 1`` hops of one K and one V block), and the case loop
(``ring_worker``): the shapes, the float32 case, the order of the checks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ddp_tutorial.env import rank_device
from ddp_tutorial.exercises.harness import Case, Report, load_function, run_cases
from ddp_tutorial.exercises.tracing import COLLECTIVES, SENDS, Trace, traced
from ddp_tutorial.exercises.watching import LargestTensor

RING_ONLY = ("this exercise asks for the ring, K/V blocks passed with isend/irecv. Gathering every rank's "
             "K/V is a valid design too (torch's context_parallel does it by default, Llama 3 trained with "
             "it), at the memory of the whole sequence's keys on every rank; it is not this exercise")
SCALE = 60.0  # the float32 cases: q scaled so that scores reach 100 and more on every rank


class WholeSequence(LargestTensor):
    """``watching.LargestTensor`` picking out the first tensor (4-D or more: keys, values, scores) an op makes
    whose last two dimensions reach ``whole``; ``seen`` is its ``(op, shape)``, or None."""

    def __init__(self, whole: int):
        super().__init__(flag=lambda t: t.dim() >= 4 and whole in t.shape[-2:])
        self.whole = whole

    @property
    def seen(self) -> tuple[str, tuple[int, ...]] | None:
        return (self.flagged.op, self.flagged.shape) if self.flagged else None

    def refusal(self) -> str:
        """What holding the tensor ``seen`` means, for the diagnosis."""
        op, shape = self.seen
        return (f"{op} made a tensor of shape {shape}: {self.whole} positions, the whole sequence's keys (or "
                "scores) held at once on one rank. Keep one K/V block at a time and merge each block's result "
                "into the running one with the log-sum-exp rule")


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    tol = 1e-10 if a.dtype == torch.float64 else 1e-4
    return a.shape == b.shape and torch.allclose(a.double(), b.double(), rtol=tol, atol=tol)


def messages(trace: Trace, rank: int, n: int, numel: int) -> str | None:
    """K/V to the right neighbour only, from the left one only, ``2 (N - 1)`` blocks' elements in all."""
    right, left = (rank + 1) % n, (rank - 1) % n
    sent = 0
    for call in trace.calls:
        sending = call.kind in SENDS
        if call.peer != (right if sending else left):
            return (f"it called {call.kind} {'to' if sending else 'from'} rank {call.peer}: in the ring rank "
                    f"{rank} sends only to {right} and receives only from {left}")
        sent += call.numel if sending else 0
    if sent != 2 * (n - 1) * numel:
        return (f"the output is right, but rank {rank} sent {sent} elements; the ring needs N - 1 = {n - 1} "
                f"hops of one K and one V block ({2 * (n - 1) * numel} elements): the last block is not sent "
                "on, and q never travels")
    return None


# (batch, heads, positions per rank (20.1) or per chunk (20.2), head_dim): head_dim never equals the whole
# sequence (N <= 4), so a last dimension as long as the sequence can only be keys or scores
SHAPES = [(1, 1, 2, 3), (2, 3, 3, 4), (1, 2, 1, 5)]
LARGE = (1, 2, 3, 8)  # the float32 case: q scaled (SCALE) so that scores reach 100 and more on every rank
Shape = tuple[int, int, int, int]
# (shape, seed, dtype) -> (the whole q, k, v in float64, this rank's q, k, v as the learner gets them)
Inputs = Callable[[Shape, int, torch.dtype], tuple[list[torch.Tensor], list[torch.Tensor]]]
# (the learner's output, the whole q, k, v, this rank's, the mode that watched the call, shape) -> what is wrong
Judge = Callable[[Any, list[torch.Tensor], list[torch.Tensor], WholeSequence, Shape], "str | None"]


def ring_worker(rank: int, world_size: int, source: str, function: str, trace_dir: str, *, inputs: Inputs,
                watch: Callable[[Shape], WholeSequence], judge: Judge, per_rank: str = "") -> Report:
    """20.1's and 20.2's case loop: each shape of ``SHAPES`` in float64 and ``LARGE`` in float32; a tensor as long
    as the whole sequence refused first, then ``judge``, the arguments unchanged, and the ring's messages.
    ``per_rank`` says what a rank holds of each shape in the cases' labels ("two chunks of ")."""
    with traced(rank, trace_dir, forbid=COLLECTIVES, reason=RING_ONLY) as trace:
        fn = load_function(source, function, refuse=("ddp_tutorial.context_parallel",))

        def case(shape: Shape, seed: int, dtype: torch.dtype = torch.float64) -> str | None:
            qkv, mine = inputs(shape, seed, dtype)
            args = [t.clone().to(rank_device()) for t in mine]
            watcher = watch(shape)
            with watcher:
                got = fn(*args)
            if world_size > 1 and watcher.seen:
                return watcher.refusal()
            wrong = judge(got, qkv, mine, watcher, shape)
            if wrong:
                return wrong
            if not all(torch.equal(a.cpu(), m) for a, m in zip(args, mine)):
                return "the output is right, but q, k or v was changed: leave the arguments as they are"
            return messages(trace, rank, world_size, mine[1].numel())

        cases: list[Case] = [(f"q, k, v of {per_rank}shape {shape} per rank", lambda s=shape, i=i: case(s, i))
                             for i, shape in enumerate(SHAPES)]
        cases.append((f"float32 q, k, v of {per_rank}shape {LARGE} per rank, scores near 100",
                      lambda: case(LARGE, len(SHAPES), torch.float32)))
        return run_cases(trace, cases)
