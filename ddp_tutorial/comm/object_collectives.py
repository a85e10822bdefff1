"""Object collectives: any picklable Python object, for small metadata (``04_collectives``).

``all_gather_object`` and ``broadcast_object_list`` (also ``gather_object`` and
``scatter_object_list``) take Python objects instead of tensors. Each pickles the
object into a byte tensor on the CPU, copies it to the group's device (with NCCL the
*current* GPU, so ``torch.cuda.set_device`` must have been called: lesson 02),
exchanges the sizes and then the padded bytes (two collectives), and copies back
and unpickles. Convenient for a config, counts, file names, a dict of metrics;
slow for data. Unpickling can run code: only within a job you trust.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ddp_tutorial.env import rank_device
from ddp_tutorial.timing import timed

__all__ = ["rank_metadata", "share_metadata", "object_vs_tensor"]


def rank_metadata(rank: int) -> dict:
    """What rank r knows about itself: a dict of different types and sizes, no tensor."""
    return {"rank": rank, "samples": 1000 + 10 * rank, "files": [f"shard-{rank}-{i}.bin" for i in range(rank + 1)]}


def share_metadata(rank: int, world_size: int) -> dict:
    """Every rank's metadata to every rank (``all_gather_object``); rank 0's config to all (``broadcast_object_list``)."""
    everyone = [None] * world_size  # one slot per rank, filled in rank order
    dist.all_gather_object(everyone, rank_metadata(rank))
    config = [{"lr": 0.1, "run": "exp-7", "seed": 42}] if rank == 0 else [None]
    dist.broadcast_object_list(config, src=0)  # in place: the list's items are replaced
    return {"gathered": everyone, "config": config[0]}


def object_vs_tensor(rank: int, world_size: int, repeat: int = 50) -> dict:
    """Best time of ``all_gather_object`` of three numbers in a dict vs ``all_gather`` of them in a tensor."""
    numbers = {"loss sum": 0.5 + rank, "correct": 90.0 + rank, "seen": 100.0}
    as_tensor = torch.tensor(list(numbers.values()), device=rank_device())
    objects = [None] * world_size
    tensors = [torch.empty_like(as_tensor) for _ in range(world_size)]
    seconds_object = timed(lambda: dist.all_gather_object(objects, numbers), repeat=repeat)
    seconds_tensor = timed(lambda: dist.all_gather(tensors, as_tensor), repeat=repeat)
    same = [list(o.values()) for o in objects] == [t.tolist() for t in tensors]
    return {"object": seconds_object, "tensor": seconds_tensor, "same numbers": same}
