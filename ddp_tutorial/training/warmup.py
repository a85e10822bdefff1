"""A linear learning-rate warm-up, for the larger global batch of more processes (``11_train_end_to_end``).

With the per-process batch kept, N processes make the global batch N times larger, and the
linear scaling rule multiplies the learning rate by N. Started at full strength, that rate
can throw the freshly initialised weights far off in the first steps, so it is ramped up
linearly over the first steps (Goyal et al., "Accurate, Large Minibatch SGD", 2017: five
epochs). ``linear_warmup`` is that ramp as a ``LambdaLR``; call ``scheduler.step()`` after
every ``optimizer.step()``.

``scaled_lr`` is the rule of thumb for the new rate: linear for SGD (Goyal et al.), which
holds only up to the *critical batch size*, past which a larger batch stops buying faster
progress and the linear rate diverges; the square root for Adam and its kin (the usual
choice for adaptive optimizers). ``accumulation_steps`` is the other way: keep the global
batch when the number of processes changes, by accumulating micro-batches.
"""

from __future__ import annotations

import torch
from torch.optim.lr_scheduler import LambdaLR

__all__ = ["warmup_factor", "linear_warmup", "scaled_lr", "accumulation_steps"]


def warmup_factor(step: int, warmup_steps: int) -> float:
    """The share of the full learning rate that optimizer step ``step`` (from 0) uses.

    It rises by ``1 / warmup_steps`` per step and reaches 1 at step ``warmup_steps - 1``.
    """
    if warmup_steps <= 0:
        return 1.0
    return min(1.0, (step + 1) / warmup_steps)


def linear_warmup(optimizer: torch.optim.Optimizer, warmup_steps: int) -> LambdaLR:
    """Scale each parameter group's learning rate by ``warmup_factor(step, warmup_steps)``.

    The optimizer's ``lr`` is the full rate; from the scheduler's creation on, the optimizer
    holds the ramped value. After ``warmup_steps`` steps the rate stays at the full value.
    """
    return LambdaLR(optimizer, lambda step: warmup_factor(step, warmup_steps))


def scaled_lr(lr: float, batch_scale: float, optimizer: str = "sgd") -> float:
    """The learning rate for a global batch ``batch_scale`` times larger: ``lr * batch_scale`` for
    ``"sgd"`` (the linear scaling rule; only below the critical batch size), ``lr * sqrt(batch_scale)``
    for ``"adam"`` (Adam, AdamW)."""
    if optimizer == "sgd":
        return lr * batch_scale
    if optimizer == "adam":
        return lr * batch_scale ** 0.5
    raise ValueError(f"optimizer must be 'sgd' or 'adam', got {optimizer!r}")


def accumulation_steps(global_batch: int, per_process_batch: int, world_size: int) -> int:
    """Micro-batches each process accumulates (``no_sync`` on all but the last) so that one optimizer
    step still sees ``global_batch`` samples on ``world_size`` processes of ``per_process_batch`` each."""
    per_step = per_process_batch * world_size
    if global_batch % per_step:
        raise ValueError(f"a global batch of {global_batch} is not a multiple of {world_size} processes x "
                         f"{per_process_batch} samples")
    return global_batch // per_step
