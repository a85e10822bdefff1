"""Exercise 9.1 (medium), lesson 09_torchrun.ipynb: rank 0's atomic checkpoint, a barrier, a map_location load.

Write save_and_load() below (its docstring is the contract: what must hold), then check it:
    check("save_and_load")                                 in the notebook
    python -m ddp_tutorial.exercises check save_and_load   from a shell
The checker's ranks read this file afresh each time: an edit counts at once.
A hint: python -m ddp_tutorial.exercises show save_and_load
Start again from the stub: python -m ddp_tutorial.exercises reset save_and_load
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist


def save_and_load(rank: int, world_size: int, state: dict, path: str, device: torch.device) -> dict:
    """Rank 0 saves ``state`` to ``path`` atomically; then every rank loads it onto ``device`` and returns it.

    - only rank 0 writes: ``torch.save`` to a temporary file in the same folder (say
      ``path + ".tmp"``), then ``os.replace(tmp, path)``; never to ``path`` itself;
    - every rank then waits at ``dist.barrier()``, so no rank reads before the file exists;
    - every rank returns ``torch.load(path, map_location=device, weights_only=True)``.
    ``state`` holds tensors, numbers and strings (a state dict); ``world_size`` is for you.
    """
    # Your code here; the checker calls save_and_load(rank, world_size, state, path, device) on every rank.
    raise NotImplementedError(
        'exercise 9.1 (save_and_load): not started yet, as expected for a fresh stub: '
        'my_exercises/save_and_load.py still raises NotImplementedError. Next: write '
        'save_and_load() there (its docstring is the contract, lesson 09_torchrun.ipynb explains '
        "it, show('save_and_load') gives hints), then check again")
