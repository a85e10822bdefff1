"""Exercise 5.2, reference solution: ``all_gather`` from point-to-point messages.

Every pair of ranks exchanges one message each way. Posting every send and every
receive before waiting on any of them means no order of calls can deadlock; with
blocking calls the ranks would have to agree on an order (for example: the lower
rank of each pair sends first).
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
    rank, world_size = dist.get_rank(), dist.get_world_size()
    gathered = [torch.empty_like(tensor) for _ in range(world_size)]
    gathered[rank].copy_(tensor)
    works = []
    for peer in range(world_size):
        if peer != rank:
            works.append(dist.isend(tensor, dst=peer))
            works.append(dist.irecv(gathered[peer], src=peer))
    for work in works:
        work.wait()
    return gathered
