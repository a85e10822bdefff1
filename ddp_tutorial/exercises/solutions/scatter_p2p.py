"""Exercise 5.1, reference solution: ``scatter`` from point-to-point messages.

The source posts one ``isend`` per other rank and copies its own chunk locally (a
rank never sends to itself); every other rank makes one blocking ``recv``. The sends
are waited for before returning: until then ``chunks`` may still be being read.
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
    rank, world_size = dist.get_rank(), dist.get_world_size()
    if rank != src:
        dist.recv(out, src=src)
        return out
    works = [dist.isend(chunks[i], dst=i) for i in range(world_size) if i != src]
    out.copy_(chunks[src])
    for work in works:
        work.wait()
    return out
