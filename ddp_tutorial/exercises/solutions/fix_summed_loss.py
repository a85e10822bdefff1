"""Exercise 12.1, reference solution: the data-parallel step that summed instead of averaging.

The broken step all-reduced every gradient with SUM and stopped there, so each update was
``n`` times one process's on the global batch: a learning rate silently ``n`` times too large,
which nothing reports (the loss may even fall faster at first, then diverge). It also returned
its own batch's loss, so rank 0's log showed a number that depended on which samples rank 0
happened to get. The fix divides both sums by the world size: the mean gradient (what torch
DDP computes, with equal batch sizes) and the mean loss of the global batch (the mean of
equal-sized batches' means). After the fix every rank takes exactly the step that one
process takes on the concatenated batches.
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
    n = dist.get_world_size()
    model.zero_grad()
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= n  # the mean over ranks, as DDP: the sum is n times one process's gradient
    with torch.no_grad():
        for p in model.parameters():
            p -= lr * p.grad
    total = loss.detach().clone()
    dist.all_reduce(total)
    return (total / n).item()  # the global batch's loss, the same on every rank
