"""A linear learning-rate warm-up, for the larger global batch of more processes (``10_train_end_to_end``).

With the per-process batch kept, N processes make the global batch N times larger, and the
linear scaling rule multiplies the learning rate by N. Started at full strength, that rate
can throw the freshly initialised weights far off in the first steps, so it is ramped up
linearly over the first steps (Goyal et al., "Accurate, Large Minibatch SGD", 2017: five
epochs). ``linear_warmup`` is that ramp as a ``LambdaLR``; call ``scheduler.step()`` after
every ``optimizer.step()``.
"""

from __future__ import annotations

import torch
from torch.optim.lr_scheduler import LambdaLR

__all__ = ["warmup_factor", "linear_warmup"]


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
