"""Exercise 19.2 (hard), lesson 19_pipeline_schedules.ipynb: a 1F1B training step with real messages.

Write one_f_one_b_step() below (its docstring is the contract: what must hold), then check it:
    check("one_f_one_b_step")                                 in the notebook
    python -m ddp_tutorial.exercises check one_f_one_b_step   from a shell
The checker's ranks read this file afresh each time: an edit counts at once.
Hints, one at a time: python -m ddp_tutorial.exercises show one_f_one_b_step [--hint 2 .. 3]
Start again from the stub: python -m ddp_tutorial.exercises reset one_f_one_b_step
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist
from torch import nn


def one_f_one_b_step(module: nn.Module, stage: int, num_stages: int, *, num_micro: int,
                     micro_batches: Sequence[torch.Tensor] | None,
                     loss_fn: Callable[[torch.Tensor, int], torch.Tensor] | None,
                     shape: tuple[int, ...]) -> torch.Tensor | None:
    """Run one training step of pipeline stage ``stage`` of ``num_stages`` (this rank is stage ``stage``).

    ``module`` is this stage's part of the model. Stage 0 gets the ``num_micro`` micro-batches
    in ``micro_batches`` (None elsewhere); the last stage gets ``loss_fn(output, i)``, micro-batch
    ``i``'s mean loss (None elsewhere). Every activation sent from one stage to the next, and every
    gradient sent back, has shape ``shape`` and the dtype and device of ``module``'s parameters.

    What must hold when it returns: each parameter's ``.grad`` is what one process would get from
    the mean loss over the whole batch (the ``m`` micro-batches together); messages went only to
    the neighbour stages, with ``dist.isend``/``dist.irecv`` (or ``send``/``recv``,
    ``batch_isend_irecv``) and every send completed; the stage ran its forwards and backwards in
    1F1B's order, so that it never held more than ``min(num_stages - stage, num_micro)``
    micro-batches' activations at once; and no stage waited for a neighbour that was itself
    waiting. Returns the whole batch's mean loss (detached) on the last stage, None elsewhere.
    """
    # Your code here; the checker calls one_f_one_b_step(module, stage, num_stages, num_micro, micro_batches, loss_fn, shape) on every rank.
    raise NotImplementedError(
        'exercise 19.2 (one_f_one_b_step): not started yet, as expected for a fresh stub: '
        'my_exercises/one_f_one_b_step.py still raises NotImplementedError. Next: write '
        'one_f_one_b_step() there (its docstring is the contract, lesson '
        "19_pipeline_schedules.ipynb explains it, show('one_f_one_b_step') gives hints), then check"
        ' again')
