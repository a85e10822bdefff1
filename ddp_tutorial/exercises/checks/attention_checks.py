"""What lesson 20's two checkers share (20.1 ``ring_attention_forward``, 20.2 ``causal_ring_attention``).

The refusal of collectives (the exercises ask for the ring), the ``TorchDispatchMode`` that sees a
tensor as long as the whole sequence (all the keys, or all the scores, held at once on one rank),
the closeness rule against a float64 reference, and the ring's messages: K/V only to the right
neighbour and from the left one, ``N - 1`` hops of one K and one V block.
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from ddp_tutorial.exercises.tracing import SENDS, Trace

RING_ONLY = ("this exercise asks for the ring, K/V blocks passed with isend/irecv. Gathering every rank's "
             "K/V is a valid design too (torch's context_parallel does it by default, Llama 3 trained with "
             "it), at the memory of the whole sequence's keys on every rank; it is not this exercise")
SCALE = 60.0  # the float32 cases: q scaled so that scores reach 100 and more on every rank


class WholeSequence(TorchDispatchMode):
    """The first tensor (4-D or more: keys, values, scores) an op makes whose last two dimensions reach ``whole``."""

    def __init__(self, whole: int):
        super().__init__()
        self.whole, self.seen = whole, None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001  (torch's protocol)
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if self.seen is None and isinstance(t, torch.Tensor) and t.dim() >= 4 and self.whole in t.shape[-2:]:
                self.seen = (str(func).split(".")[1] if "." in str(func) else str(func), tuple(t.shape))
        return out

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
