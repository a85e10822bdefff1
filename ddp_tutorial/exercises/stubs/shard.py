"""Exercise 7.1 (medium), lesson 07_ddp_spawn.ipynb: a DistributedSampler of your own: padding and a shuffle per epoch.

Write shard() below (its docstring is the contract: what must hold), then check it:
    check("shard")                                 in the notebook
    python -m ddp_tutorial.exercises check shard   from a shell
The checker's ranks read this file afresh each time: an edit counts at once.
A hint: python -m ddp_tutorial.exercises show shard
Start again from the stub: python -m ddp_tutorial.exercises reset shard
"""

from __future__ import annotations

import math

import torch


def shard(num_samples: int, rank: int, world_size: int, epoch: int, seed: int = 0) -> list[int]:
    """Rank ``rank``'s indices for ``epoch``, exactly as ``DistributedSampler(shuffle=True)`` gives them.

    - shuffle: ``g = torch.Generator(); g.manual_seed(seed + epoch)``, then
      ``torch.randperm(num_samples, generator=g).tolist()``: the same order on every rank,
      a different one each epoch;
    - pad: append the first indices of that order again (as often as needed, even when
      ``num_samples`` is smaller than ``world_size``) up to ``ceil(num_samples / world_size)
      * world_size`` indices;
    - split: rank ``rank`` takes ``indices[rank::world_size]``.
    No communication: the ranks agree because they compute the same thing.
    """
    # Your code here; the checker calls shard(num_samples, rank, world_size, epoch, seed) on every rank.
    raise NotImplementedError(
        'exercise 7.1 (shard): not started yet, as expected for a fresh stub: my_exercises/shard.py'
        ' still raises NotImplementedError. Next: write shard() there (its docstring is the '
        "contract, lesson 07_ddp_spawn.ipynb explains it, show('shard') gives hints), then check "
        'again')
