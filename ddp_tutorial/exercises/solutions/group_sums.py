"""Exercise 2.2, reference solution: sum inside the even and the odd sub-group, and over the world.

``dist.new_group`` is itself a collective of the whole world: every rank calls it for
every group, in the same order, even for a group it is not in (it gets back a
non-member handle for those). A rank that creates only its own group leaves the others
waiting, or pairs its call with another rank's call for a different group. Once both
groups exist, each rank all-reduces in the one it belongs to; a second all-reduce with
no ``group=`` uses the default group, the whole world.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ddp_tutorial.env import rank_device


def group_sums(rank: int, world_size: int, value: float) -> tuple[float, float]:
    """Return ``(group_sum, world_sum)`` of ``value`` over this rank's parity group and over the world.

    The even ranks (0, 2, 4, ...) form one sub-group and the odd ranks (1, 3, ...) the
    other (with one rank there is no odd group). Make both with ``dist.new_group``:
    EVERY rank calls it for EVERY group, in the same order, even for a group it is not
    in. Then all-reduce (SUM) ``value`` in this rank's own group (``group=``), and once
    more over the whole world (the default group). Use tensors on
    ``ddp_tutorial.env.rank_device()``; return two Python floats (``.item()``).
    """
    parities = [list(range(start, world_size, 2)) for start in (0, 1) if start < world_size]
    groups = [dist.new_group(ranks) for ranks in parities]  # every rank, every group, same order
    mine = groups[rank % 2]
    in_group = torch.tensor([value], device=rank_device())
    dist.all_reduce(in_group, group=mine)
    in_world = torch.tensor([value], device=rank_device())
    dist.all_reduce(in_world)
    return in_group.item(), in_world.item()
