"""Exercise 6.1 (hard), lesson 06_ring_all_reduce.ipynb: the ring all-reduce: reduce-scatter, then all-gather.

Write ring_all_reduce() below (its docstring is the contract: what must hold), then check it:
    check("ring_all_reduce")                                 in the notebook
    python -m ddp_tutorial.exercises check ring_all_reduce   from a shell
The checker's ranks read this file afresh each time: an edit counts at once.
Hints, one at a time: python -m ddp_tutorial.exercises show ring_all_reduce [--hint 2 .. 3]
Start again from the stub: python -m ddp_tutorial.exercises reset ring_all_reduce
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def ring_all_reduce(tensor: torch.Tensor) -> torch.Tensor:
    """Sum ``tensor`` over all ranks in place with a ring, and return it (what ``dist.all_reduce`` does).

    After the call, on every rank, ``tensor`` (the same object, any shape, dtype and numel,
    even fewer elements than ranks) holds the element-wise sum of every rank's input, and:
    - the sum was built by the ring algorithm: ``n - 1`` reduce-scatter steps, then
      ``n - 1`` all-gather steps, each sending one chunk of about ``numel / n`` elements;
    - each rank sent only to its right neighbour ``(rank + 1) % n`` and received only from
      its left one ``(rank - 1) % n``, with ``dist.isend``/``dist.irecv`` (or ``send``/
      ``recv``), never more than ``2 (n - 1)`` chunks; ``dist.all_reduce`` and the other
      collectives are refused;
    - no rank waits for a peer that is itself waiting (post each step's send and receive
      together).
    With fewer elements than ranks some chunks are empty: they need no special case (a
    message of zero elements is valid); skipping one is a saving that sender and receiver
    must both make.
    Work it out on paper for ``n = 3`` first; then, from the idea to the formulas:
    ``show("ring_all_reduce", hint=1)``, 2, 3.
    """
    # Your code here; the checker calls ring_all_reduce(tensor) on every rank.
    raise NotImplementedError(
        'exercise 6.1 (ring_all_reduce): not started yet, as expected for a fresh stub: '
        'my_exercises/ring_all_reduce.py still raises NotImplementedError. Next: write '
        'ring_all_reduce() there (its docstring is the contract, lesson 06_ring_all_reduce.ipynb '
        "explains it, show('ring_all_reduce') gives hints), then check again")
