"""Object collectives: any picklable Python object, for small metadata (``05_collectives``).

``all_gather_object`` and ``broadcast_object_list`` (also ``gather_object`` and
``scatter_object_list``) take Python objects instead of tensors. Each pickles the
object into a byte tensor on the CPU, copies it to the group's device (with NCCL the
*current* GPU, so ``torch.cuda.set_device`` must have been called: lesson 02),
exchanges the sizes and then the padded bytes (two collectives), and copies back
and unpickles. Convenient for a config, counts, file names, a dict of metrics;
slow for data. Unpickling can run code: only within a job you trust.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from ddp_tutorial.env import rank_device
from ddp_tutorial.timing import timed

__all__ = ["rank_metadata", "share_metadata", "counting_all_gathers", "object_vs_tensor"]


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


# The all-gathers ``all_gather_object`` may call, depending on the torch version; the input is the second argument.
ALL_GATHERS = ("all_gather", "all_gather_into_tensor", "all_gather_single")


@contextlib.contextmanager
def counting_all_gathers() -> Iterator[list[int]]:
    """Within the block, record the bytes this rank puts into each all-gather it calls, including the
    ones ``all_gather_object`` makes (looked up in torch's ``distributed_c10d`` module when it runs)."""
    sent: list[int] = []
    depth = [0]  # one all-gather implemented with another counts once
    real = {name: getattr(c10d, name) for name in ALL_GATHERS if hasattr(c10d, name)}

    def counting(fn):
        def counted(output, tensor, *args, **kwargs):
            if not depth[0]:
                sent.append(tensor.numel() * tensor.element_size())
            depth[0] += 1
            try:
                return fn(output, tensor, *args, **kwargs)
            finally:
                depth[0] -= 1
        return counted

    for name, fn in real.items():
        setattr(c10d, name, counting(fn))
    try:
        yield sent
    finally:
        for name, fn in real.items():
            setattr(c10d, name, fn)


def object_vs_tensor(rank: int, world_size: int, repeat: int = 50) -> dict:
    """Best time of ``all_gather_object`` of three numbers in a dict vs ``all_gather`` of them in a tensor,
    and, counted once each, the bytes of every ``all_gather`` the two make (``object calls``, ``tensor calls``)."""
    numbers = {"loss sum": 0.5 + rank, "correct": 90.0 + rank, "seen": 100.0}
    as_tensor = torch.tensor(list(numbers.values()), device=rank_device())
    objects = [None] * world_size
    tensors = [torch.empty_like(as_tensor) for _ in range(world_size)]
    with counting_all_gathers() as object_calls:
        dist.all_gather_object(objects, numbers)
    with counting_all_gathers() as tensor_calls:
        c10d.all_gather(tensors, as_tensor)  # the module's name, the one counting_all_gathers replaces
    seconds_object = timed(lambda: dist.all_gather_object(objects, numbers), repeat=repeat)
    seconds_tensor = timed(lambda: dist.all_gather(tensors, as_tensor), repeat=repeat)
    same = [list(o.values()) for o in objects] == [t.tolist() for t in tensors]
    return {"object": seconds_object, "tensor": seconds_tensor, "same numbers": same,
            "object calls": object_calls, "tensor calls": tensor_calls}
