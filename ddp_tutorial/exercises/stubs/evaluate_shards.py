"""Exercise 11.1 (medium), lesson 11_train_end_to_end.ipynb: all-rank evaluation: score your shard, all-reduce the sums.

Write evaluate_shards() below (its docstring is the contract: what must hold), then check it:
    check("evaluate_shards")                                 in the notebook
    python -m ddp_tutorial.exercises check evaluate_shards   from a shell
The checker's ranks read this file afresh each time: an edit counts at once.
A hint: python -m ddp_tutorial.exercises show evaluate_shards
Start again from the stub: python -m ddp_tutorial.exercises reset evaluate_shards
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
    # Your code here; the checker calls evaluate_shards(model, shard, device) on every rank.
    raise NotImplementedError(
        'exercise 11.1 (evaluate_shards): not started yet, as expected for a fresh stub: '
        'my_exercises/evaluate_shards.py still raises NotImplementedError. Next: write '
        'evaluate_shards() there (its docstring is the contract, lesson 11_train_end_to_end.ipynb '
        "explains it, show('evaluate_shards') gives hints), then check again")
