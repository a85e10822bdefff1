"""How ``DistributedSampler`` shares a dataset out, and what that does to a metric (``07_ddp_spawn``).

When ``N`` samples do not divide evenly over ``world_size`` ranks, ``DistributedSampler``
gives every rank ``ceil(N / world_size)`` indices anyway: it **pads** by repeating the
first few indices, so that all ranks take the same number of steps (DDP needs that).
For training a couple of repeated samples per epoch do no harm. For a validation metric
they do: the repeated samples are counted twice. ``DistributedSampler(drop_last=True)``
trims to a multiple of ``world_size`` instead (no repeats, but some samples never seen),
and ``DataLoader(drop_last=True)`` is something else again: it drops each rank's last
incomplete *batch*, after the sampler has padded. To count every sample once, give each
rank an unpadded shard (``data.shard_indices``: shares may differ by one), evaluate the
bare model (not the DDP wrapper, whose forward expects equal step counts), and sum the
counts with one all-reduce.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler

from ddp_tutorial.env import rank_device
from ddp_tutorial.training.data import shard_indices

__all__ = ["SHARINGS", "rank_batches", "validation_counts"]

# How the validation set is shared out: the name, and what rank_batches does for it.
SHARINGS = {
    "DistributedSampler": "pads: repeats the first indices to a multiple of world_size",
    "DistributedSampler(drop_last=True)": "trims to a multiple of world_size",
    "DataLoader(drop_last=True)": "the padded sampler, then each rank drops its last incomplete batch",
    "unpadded shard": "data.shard_indices: rank r takes r, r + world_size, ...; shares may differ by one",
}


def rank_batches(n: int, rank: int, world_size: int, sharing: str, batch_size: int = 2) -> list[list[int]]:
    """The batches of sample indices ``rank`` reads from a dataset of ``n``, shared out as ``sharing``.

    No process group is needed: rank and world size are given (``shuffle=False``, as for validation).
    """
    if sharing not in SHARINGS:
        raise ValueError(f"unknown sharing {sharing!r}; choose one of {', '.join(SHARINGS)}")
    dataset = range(n)
    if sharing == "unpadded shard":
        indices = shard_indices(n, rank, world_size)
        return [indices[i:i + batch_size] for i in range(0, len(indices), batch_size)]
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=False,
                                 drop_last=sharing == "DistributedSampler(drop_last=True)")
    loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler,
                        drop_last=sharing == "DataLoader(drop_last=True)")
    return [batch.tolist() for batch in loader]


def validation_counts(rank: int, world_size: int, correct: list[bool], sharing: str,
                      batch_size: int = 2) -> dict:
    """Accuracy over a validation set whose per-sample verdicts are ``correct``, summed over the ranks.

    Each rank counts the samples it reads (as ``sharing`` gives them out), then one
    all-reduce adds up (correct, counted). The verdicts are fixed so that only the
    counting differs between sharings.
    """
    device = rank_device()
    verdicts = torch.tensor(correct, dtype=torch.float64)
    mine = [i for batch in rank_batches(len(correct), rank, world_size, sharing, batch_size) for i in batch]
    totals = torch.tensor([verdicts[mine].sum().item(), float(len(mine))], dtype=torch.float64, device=device)
    dist.all_reduce(totals)
    right, counted = totals.tolist()
    return {"indices": mine, "correct": int(right), "counted": int(counted)}
