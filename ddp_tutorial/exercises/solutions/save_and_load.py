"""Exercise 9.1, reference solution: rank 0 writes the checkpoint atomically, a barrier, everyone loads.

All ranks hold the same weights, so one writer is enough, and two writers to one file can
interleave their bytes. Rank 0 writes to a temporary file in the same folder and renames
it over ``path`` with ``os.replace``: a rename within one file system is atomic, so
``path`` is always either the old complete checkpoint or the new one, never half a file,
even if the job is killed mid-write (what torchrun's restart of lesson 09 relies on). The
barrier makes every rank wait until the file is there; without it a fast rank reads a file
that does not exist yet, or an older one. ``map_location`` puts the tensors on the rank's
own device (saved from ``cuda:0``, they would otherwise all land on GPU 0), and
``weights_only=True`` refuses to run code hidden in a pickle. ``checkpoint.save_checkpoint``
does the same and also fsyncs and cleans up after a failure.
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
    if rank == 0:
        tmp = path + ".tmp"
        torch.save(state, tmp)
        os.replace(tmp, path)
    dist.barrier()
    return torch.load(path, map_location=device, weights_only=True)
