"""Exercise 12.1 (medium), lesson 12_debugging_and_pitfalls.ipynb: find the bug: a data-parallel step that sums instead of averaging.

Write fix_summed_loss() below (its docstring is the contract: what must hold), then check it:
    check("fix_summed_loss")                                 in the notebook
    python -m ddp_tutorial.exercises check fix_summed_loss   from a shell
The checker's ranks read this file afresh each time: an edit counts at once.
A hint: python -m ddp_tutorial.exercises show fix_summed_loss
Start again from the stub: python -m ddp_tutorial.exercises reset fix_summed_loss
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn


def fix_summed_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor, lr: float) -> float:
    """One SGD step of data-parallel training; this version has a bug: find it and fix it.

    Every rank holds the same ``model`` and its own batch ``x, y`` (all batches the same
    size). The step must equal one process's SGD step (``p -= lr * p.grad``) on all ranks'
    batches together, leave in every ``p.grad`` that global batch's gradient (an optimizer
    with momentum or weight decay would read it), and return the mean squared error of that
    global batch before the step, the same float on every rank. The code you start from (it runs, and learns, but wrongly)::

        model.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
        with torch.no_grad():
            for p in model.parameters():
                p -= lr * p.grad
        return loss.item()

    Copy it into the body below and fix it (no ``DistributedDataParallel``: write the
    collective yourself).
    """
    # Your code here; the checker calls fix_summed_loss(model, x, y, lr) on every rank.
    raise NotImplementedError(
        'exercise 12.1 (fix_summed_loss): not started yet, as expected for a fresh stub: '
        'my_exercises/fix_summed_loss.py still raises NotImplementedError. Next: write '
        'fix_summed_loss() there (its docstring is the contract, lesson '
        "12_debugging_and_pitfalls.ipynb explains it, show('fix_summed_loss') gives hints), then "
        'check again')
