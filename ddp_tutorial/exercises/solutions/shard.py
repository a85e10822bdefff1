"""Exercise 7.1, reference solution: a DistributedSampler of your own, padded and shuffled per epoch.

Every rank computes the same permutation without a message: the generator is seeded with
``seed + epoch``, the same numbers on every rank, and a new order each epoch (that is all
``set_epoch`` does). Padding repeats the first indices of the permutation until the length
is a multiple of ``world_size``, so every rank gets ``ceil(n / world_size)`` indices and
takes the same number of steps (a rank with one step fewer would leave the others waiting
in an all-reduce). Then rank ``r`` takes every ``world_size``-th index from ``r`` on: the
shards are disjoint apart from the padding and together cover the whole data set.
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
    g = torch.Generator()
    g.manual_seed(seed + epoch)
    indices = torch.randperm(num_samples, generator=g).tolist()
    total = math.ceil(num_samples / world_size) * world_size
    while len(indices) < total:
        indices += indices[:total - len(indices)]
    return indices[rank:total:world_size]
