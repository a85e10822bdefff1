"""Exercise 23.3's reference: a DDP step of a small MLP, run, with its FLOPs and all-reduce bytes counted.

Nothing here is a formula. ``count_step`` builds the MLP under ``DistributedDataParallel`` on the
checker's ranks (gloo), runs one forward and backward of this rank's rows after a warm-up, and
counts what ran: the FLOPs with ``torch.utils.flop_counter.FlopCounterMode`` (forward and
backward apart), the gradient bytes with ``AllReduceBytes``, a ``TorchDispatchMode`` that sums
the buffers DDP's reducer hands to ``c10d.allreduce_`` (from C++: a Python-level patch of
``dist.all_reduce`` would see nothing). ``lesson_how_fast_scale`` compares the learner's
prediction with these counts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode


class AllReduceBytes(TorchDispatchMode):
    """While active: ``nbytes``, the bytes of every buffer handed to ``c10d.allreduce_``, and
    ``others``, the names of any other c10d op (a DDP step after its warm-up should run none)."""

    def __init__(self) -> None:
        super().__init__()
        self.nbytes = 0
        self.others: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if func.namespace == "c10d":
            name = func.__name__.split(".")[0]
            if name == "allreduce_":
                flat = [t for a in args for t in (a if isinstance(a, (list, tuple)) else [a])]
                self.nbytes += sum(t.nbytes for t in flat if isinstance(t, torch.Tensor))
            else:
                self.others.append(name)
        return func(*args, **(kwargs or {}))


@dataclass(frozen=True)
class Counted:
    """One rank's step as it ran: FLOPs forward and backward, bytes handed to the all-reduce."""

    forward: int
    backward: int
    buffer: int

    @property
    def flops(self) -> int:
        return self.forward + self.backward


def mlp(sizes: list[tuple[int, int]]) -> nn.Sequential:
    """``nn.Linear(i, o)`` for each ``(i, o)``, a ReLU between two."""
    layers: list[nn.Module] = []
    for k, (d_in, d_out) in enumerate(sizes):
        layers += [nn.ReLU()] * (k > 0) + [nn.Linear(d_in, d_out)]
    return nn.Sequential(*layers)


def count_step(sizes: list[tuple[int, int]], batch: int, rank: int, world_size: int) -> Counted:
    """Run one DDP step of ``mlp(sizes)`` on this rank's share of ``batch`` rows; count it (every rank calls it)."""
    torch.manual_seed(0)
    model = DistributedDataParallel(mlp(sizes))
    rows = torch.randn(batch, sizes[0][0], generator=torch.Generator().manual_seed(1)).chunk(world_size)[rank]
    for _ in range(2):  # warm-up: DDP rebuilds its buckets after the first step, with a broadcast
        model(rows).square().mean().backward()
    model.zero_grad(set_to_none=True)
    with AllReduceBytes() as sent:
        with FlopCounterMode(display=False) as forward:
            loss = model(rows).square().mean()
        with FlopCounterMode(display=False) as backward:
            loss.backward()
    if sent.others or not sent.nbytes:
        raise RuntimeError(f"the checker's DDP step ran {sent.others} and all-reduced {sent.nbytes} bytes: "
                           "expected the gradients' all-reduce alone")
    return Counted(forward.get_total_flops(), backward.get_total_flops(), sent.nbytes)
