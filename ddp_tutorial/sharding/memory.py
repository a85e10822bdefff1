"""Bytes per rank: the textbook formulas, what a rank really holds, and the model lesson 14 counts them on.

``14_sharding`` compares four ways to train one model on N ranks by the *model states*
each rank holds: parameters, gradients and optimizer state (activations and temporary
communication buffers are not counted: they depend on the batch, not on the model).
With Psi parameters in float32 and Adam (two states per parameter):

    strategy   params     grads      optimizer state   total
    DDP        4 Psi      4 Psi      8 Psi             16 Psi
    ZeRO-1     4 Psi      4 Psi      8 Psi / N
    ZeRO-2     4 Psi      4 Psi / N  8 Psi / N
    FSDP2      4 Psi / N  4 Psi / N  8 Psi / N         16 Psi / N   (ZeRO-3)

``formula`` computes these (any bytes per element, e.g. the ZeRO paper's mixed precision:
2 + 2 + 12); ``held`` measures the same from real tensors: element counts times element
size, of each tensor's local part (``DTensor.to_local()``: a rank's shard under FSDP2).
``zero.py`` and ``fsdp.py`` train ``TinyTransformer`` and report ``Footprint``s.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass

import torch
from torch.distributed.tensor import DTensor

__all__ = ["STRATEGIES", "Footprint", "formula", "tensor_bytes", "held", "optimizer_state_bytes", "table_rows"]

STRATEGIES = ("DDP", "ZeRO-1", "ZeRO-2", "FSDP2")
# What each strategy shards over the N ranks: (params, grads, optimizer state).
_SHARDED = {"DDP": (False, False, False), "ZeRO-1": (False, False, True),
            "ZeRO-2": (False, True, True), "FSDP2": (True, True, True)}


@dataclass(frozen=True)
class Footprint:
    """Bytes one rank holds for the model states."""

    params: int
    grads: int
    optim: int

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optim

    def as_dict(self) -> dict[str, int]:
        return {**asdict(self), "total": self.total}


def formula(strategy: str, num_params: int, world_size: int, param_bytes: int = 4, grad_bytes: int = 4,
            state_bytes: int = 8) -> Footprint:
    """The textbook bytes per rank for ``strategy`` (one of ``STRATEGIES``); a shard is rounded up."""
    def share(nbytes: int, sharded: bool) -> int:
        return -(-nbytes // world_size) if sharded else nbytes

    p, g, s = _SHARDED[strategy]
    return Footprint(share(num_params * param_bytes, p), share(num_params * grad_bytes, g),
                     share(num_params * state_bytes, s))


def tensor_bytes(t: torch.Tensor | None) -> int:
    """Bytes of what this rank holds of ``t``: its local shard for a ``DTensor``, 0 for None."""
    if t is None:
        return 0
    local = t.to_local() if isinstance(t, DTensor) else t
    return local.numel() * local.element_size()


def optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of the optimizer's per-element state on this rank (Adam: ``exp_avg``, ``exp_avg_sq``).

    Adam's ``step`` counter is a 0-dim tensor per parameter tensor: a few bytes per tensor,
    not per element, left out as the formulas leave it out.
    """
    return sum(tensor_bytes(v) for state in optimizer.state.values() for v in state.values()
               if torch.is_tensor(v) and v.dim() > 0)


def held(params: Iterable[torch.Tensor], optimizer: torch.optim.Optimizer) -> Footprint:
    """What a rank holds for ``params`` (and their ``.grad``) and ``optimizer``'s state."""
    params = list(params)
    return Footprint(sum(tensor_bytes(p) for p in params), sum(tensor_bytes(p.grad) for p in params),
                     optimizer_state_bytes(optimizer))


def table_rows(per_world_size: dict[int, list[dict]], num_params: int,
               strategies: tuple[str, ...] = STRATEGIES) -> list[dict]:
    """One row per (world size, strategy): the bytes of the rank holding the most, next to ``formula``.

    ``per_world_size[n]`` is what each of n ranks returned (a ``Footprint`` per strategy).
    """
    rows = []
    for n, ranks in per_world_size.items():
        ddp = max(r["DDP"].total for r in ranks)
        for strategy in strategies:
            got = max((r[strategy] for r in ranks), key=lambda f: f.total)
            want = formula(strategy.split(" ")[0], num_params, n)
            rows.append({"ranks": n, "strategy": strategy, **got.as_dict(), "formula": want.total,
                         "vs DDP": got.total / ddp})
    return rows
