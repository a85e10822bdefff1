"""Exercise 4.1 (medium), lesson 04_point_to_point.ipynb: pass tokens around a ring without a deadlock.

Write ring_shift() below (its docstring is the contract: what must hold), then check it:
    check("ring_shift")                                 in the notebook
    python -m ddp_tutorial.exercises check ring_shift   from a shell
The checker's ranks read this file afresh each time: an edit counts at once.
A hint: python -m ddp_tutorial.exercises show ring_shift
Start again from the stub: python -m ddp_tutorial.exercises reset ring_shift
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def ring_shift(tensor: torch.Tensor, hops: int = 1) -> torch.Tensor:
    """Move every rank's ``tensor`` ``hops`` places to the right around the ring; return what arrives.

    One hop at a time: each rank sends what it holds to its right neighbour
    ``(rank + 1) % world_size`` and receives from its left one ``(rank - 1) % world_size``.
    After ``hops`` hops rank ``r`` holds the tensor that rank ``(r - hops) % world_size``
    started with. Post the send and the receive of a hop together (``dist.isend`` and
    ``dist.irecv``, then ``wait()`` on both): with blocking ``send`` first on every
    rank, all of them wait forever. Leave ``tensor`` unchanged and return a new
    tensor (a copy of ``tensor`` when ``hops`` is 0 or the world has one rank).
    """
    # Your code here; the checker calls ring_shift(tensor, hops) on every rank.
    raise NotImplementedError(
        'exercise 4.1 (ring_shift): not started yet, as expected for a fresh stub: '
        'my_exercises/ring_shift.py still raises NotImplementedError. Next: write ring_shift() '
        'there (its docstring is the contract, lesson 04_point_to_point.ipynb explains it, '
        "show('ring_shift') gives hints), then check again")
