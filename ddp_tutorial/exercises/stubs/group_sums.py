"""Exercise 2.2 (warm-up), lesson 02_process_groups.ipynb: sum in the even and the odd sub-group.

Write group_sums() below (its docstring is the contract: what must hold), then check it:
    check("group_sums")                                 in the notebook
    python -m ddp_tutorial.exercises check group_sums   from a shell
The checker's ranks read this file afresh each time: an edit counts at once.
A hint: python -m ddp_tutorial.exercises show group_sums
Start again from the stub: python -m ddp_tutorial.exercises reset group_sums
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
    # Your code here; the checker calls group_sums(rank, world_size, value) on every rank.
    raise NotImplementedError(
        'exercise 2.2 (group_sums): not started yet, as expected for a fresh stub: '
        'my_exercises/group_sums.py still raises NotImplementedError. Next: write group_sums() '
        'there (its docstring is the contract, lesson 02_process_groups.ipynb explains it, '
        "show('group_sums') gives hints), then check again")
