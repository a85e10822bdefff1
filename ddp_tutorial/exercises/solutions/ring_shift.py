"""Exercise 4.1, reference solution: tokens hop around a ring without a deadlock.

With blocking calls, "everyone sends to the right, then receives from the left"
deadlocks: every rank sits in ``send`` waiting for a neighbour that sits in ``send``
too. Posting both operations first (``isend`` and ``irecv``) and only then waiting
lets every message meet its receive, whatever order the ranks run in. Two buffers
swap roles each hop: the one that just arrived is the next one sent.
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
    rank, world_size = dist.get_rank(), dist.get_world_size()
    held = tensor.clone()
    if world_size == 1:
        return held
    right, left = (rank + 1) % world_size, (rank - 1) % world_size
    arriving = torch.empty_like(tensor)
    for _ in range(hops):
        works = [dist.isend(held, dst=right), dist.irecv(arriving, src=left)]
        for work in works:
            work.wait()
        held, arriving = arriving, held  # what arrived is sent next; the old buffer is free again
    return held
