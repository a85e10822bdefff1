"""Exercise 5.1 (hard), lesson 05_ring_all_reduce.ipynb: the ring all-reduce: reduce-scatter, then all-gather.

Write ring_all_reduce() below (its docstring says exactly what to do), then check it:
    check("ring_all_reduce")                                 in the notebook
    python -m ddp_tutorial.exercises check ring_all_reduce   from a shell
The checker's ranks read this file afresh each time: an edit counts at once.
A hint: python -m ddp_tutorial.exercises show ring_all_reduce
Start again from the stub: python -m ddp_tutorial.exercises reset ring_all_reduce
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def ring_all_reduce(tensor: torch.Tensor) -> torch.Tensor:
    """Sum ``tensor`` over all ranks in place with a ring, and return it (what ``dist.all_reduce`` does).

    Cut the flattened tensor (``tensor.view(-1)``; it is contiguous) into ``world_size``
    chunks of nearly equal size: any numel, even fewer elements than ranks. With ``n``
    ranks, ``right = (rank + 1) % n`` and ``left = (rank - 1) % n``:
    - reduce-scatter, steps ``t = 0 .. n-2``: send chunk ``(rank - t) % n`` to the right,
      receive a chunk from the left and add it into chunk ``(rank - t - 1) % n``;
      afterwards chunk ``(rank + 1) % n`` holds the full sum;
    - all-gather, steps ``t = 0 .. n-2``: send chunk ``(rank + 1 - t) % n`` to the right,
      receive from the left straight into chunk ``(rank - t) % n``.
    Only point-to-point messages between neighbours (``dist.isend``/``dist.irecv``, or
    ``send``/``recv``); post each step's send and receive together so no rank waits for
    one that is waiting too. ``dist.all_reduce`` and the other collectives are refused.
    """
    # Your code here; the checker calls ring_all_reduce(tensor) on every rank.
    raise NotImplementedError(
        'exercise 5.1 (ring_all_reduce): not implemented yet: open my_exercises/ring_all_reduce.py '
        'and write it; lesson 05_ring_all_reduce.ipynb explains it')
