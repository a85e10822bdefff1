"""Exercise 5.1 (warm-up), lesson 05_collectives.ipynb: scatter from send and recv.

Write scatter_p2p() below (its docstring is the contract: what must hold), then check it:
    check("scatter_p2p")                                 in the notebook
    python -m ddp_tutorial.exercises check scatter_p2p   from a shell
The checker's ranks read this file afresh each time: an edit counts at once.
A hint: python -m ddp_tutorial.exercises show scatter_p2p
Start again from the stub: python -m ddp_tutorial.exercises reset scatter_p2p
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def scatter_p2p(out: torch.Tensor, chunks: list[torch.Tensor] | None, src: int = 0) -> torch.Tensor:
    """``dist.scatter`` from point-to-point messages: rank ``src`` gives ``chunks[i]`` to rank ``i``.

    On rank ``src``, ``chunks`` holds ``world_size`` tensors shaped like ``out``: send
    ``chunks[i]`` to every other rank ``i`` (``dist.send`` or ``dist.isend``) and copy
    its own ``chunks[src]`` into ``out`` (no message to itself). Every other rank is
    given ``chunks=None`` and receives its chunk from ``src`` into ``out``
    (``dist.recv``). Return ``out`` on every rank. Only point-to-point calls:
    ``dist.scatter`` and the other collectives are refused.
    """
    # Your code here; the checker calls scatter_p2p(out, chunks, src) on every rank.
    raise NotImplementedError(
        'exercise 5.1 (scatter_p2p): not started yet, as expected for a fresh stub: '
        'my_exercises/scatter_p2p.py still raises NotImplementedError. Next: write scatter_p2p() '
        'there (its docstring is the contract, lesson 05_collectives.ipynb explains it, '
        "show('scatter_p2p') gives hints), then check again")
