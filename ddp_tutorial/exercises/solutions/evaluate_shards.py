"""Exercise 11.1, reference solution: every rank scores its shard, one all-reduce adds the sums.

Loss and accuracy over a test set are ratios of sums: (loss sum, correct, count). Sums
split over ranks, so each rank adds up its own shard and one ``all_reduce`` with ``SUM``
gives every rank the totals one process scoring everything would get. Averaging instead
(``ReduceOp.AVG``, or dividing by the world size) is wrong twice: the totals come out
``world_size`` times too small, and with uneven shards a mean of per-rank means weighs the
samples unequally. Divide only at the very end: ``loss_sum / count``, ``correct / count``.
``ddp_tutorial/training/evaluation.py`` does the same with ``score`` and ``evaluate``.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn


def evaluate_shards(model: nn.Module, shard: Iterable[tuple[torch.Tensor, torch.Tensor]],
                    device: torch.device) -> torch.Tensor:
    """(loss sum, correct, count) over ALL ranks' shards, on every rank: a float64 tensor of 3.

    ``shard`` is this rank's part of the test set, an iterable of ``(x, y)`` batches (it may
    be empty; shards may differ in size). For each batch: ``logits = model(x)`` (on
    ``device``), add ``F.cross_entropy(logits, y, reduction="sum")`` to the loss sum, the
    number of ``logits.argmax(1) == y`` to correct and ``len(y)`` to count. Keep the three
    in one float64 tensor on ``device``, then ``dist.all_reduce`` it (SUM) so every rank
    returns the totals of the whole test set. ``model.eval()`` and ``torch.no_grad()``.
    """
    model.eval()
    totals = torch.zeros(3, dtype=torch.float64, device=device)
    with torch.no_grad():
        for x, y in shard:
            x, y = x.to(device), y.to(device)
            logits = model(x)
            totals[0] += F.cross_entropy(logits, y, reduction="sum").double()
            totals[1] += (logits.argmax(dim=1) == y).sum()
            totals[2] += len(y)
    dist.all_reduce(totals)
    return totals
