"""Exercise 5.2 (medium), lesson 05_collectives.ipynb: all_gather from isend and irecv.

Write all_gather_p2p() below (its docstring is the contract: what must hold), then check it:
    check("all_gather_p2p")                                 in the notebook
    python -m ddp_tutorial.exercises check all_gather_p2p   from a shell
The checker's ranks read this file afresh each time: an edit counts at once.
A hint: python -m ddp_tutorial.exercises show all_gather_p2p
Start again from the stub: python -m ddp_tutorial.exercises reset all_gather_p2p
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def all_gather_p2p(tensor: torch.Tensor) -> list[torch.Tensor]:
    """``dist.all_gather`` from point-to-point messages: every rank's ``tensor``, in rank order.

    Return a list of ``world_size`` new tensors: entry ``i`` holds rank ``i``'s
    ``tensor`` (every rank's has the same shape and dtype), entry ``rank`` a copy of
    this rank's own. Send ``tensor`` to every other rank and receive theirs: post all
    the sends and receives first (``dist.isend``/``dist.irecv``), then ``wait()`` on
    each. Leave ``tensor`` unchanged. Only point-to-point calls: ``dist.all_gather``
    and the other collectives are refused.
    """
    # Your code here; the checker calls all_gather_p2p(tensor) on every rank.
    raise NotImplementedError(
        'exercise 5.2 (all_gather_p2p): not started yet, as expected for a fresh stub: '
        'my_exercises/all_gather_p2p.py still raises NotImplementedError. Next: write '
        'all_gather_p2p() there (its docstring is the contract, lesson 05_collectives.ipynb '
        "explains it, show('all_gather_p2p') gives hints), then check again")
