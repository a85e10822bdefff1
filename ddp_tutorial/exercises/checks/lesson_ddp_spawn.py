"""Lesson 07's exercise: the sampler's arithmetic, compared with torch's ``DistributedSampler``.

Each rank asks the learner's ``shard`` for its own indices and compares them with
``DistributedSampler(range(n), world_size, rank, shuffle=True, seed=seed)`` after
``set_epoch(epoch)``: data set sizes that divide evenly and that do not, smaller than the
world, and several epochs, so a missing padding and an order that ignores the epoch show.
"""

from __future__ import annotations

import math

import torch
from torch.utils.data import DistributedSampler

from ddp_tutorial.exercises.exercise import Exercise
from ddp_tutorial.exercises.harness import Case, Report, load_function, run_cases
from ddp_tutorial.exercises.tracing import COLLECTIVES, traced

# (num_samples, epoch, seed): even, uneven, a later epoch, fewer samples than ranks, another seed
CASES = [(12, 0, 0), (10, 0, 0), (10, 1, 0), (10, 2, 0), (7, 3, 0), (2, 1, 0), (1, 0, 0), (25, 5, 42)]


def torch_shard(num_samples: int, rank: int, world_size: int, epoch: int, seed: int) -> list[int]:
    """What torch's DistributedSampler gives this rank in this epoch."""
    sampler = DistributedSampler(range(num_samples), num_replicas=world_size, rank=rank, shuffle=True, seed=seed)
    sampler.set_epoch(epoch)
    return list(sampler)


def diagnose(got: list[int], want: list[int], num_samples: int, rank: int, world_size: int, epoch: int,
             seed: int) -> str:
    """Name what differs from the sampler, and the likely mistake."""
    head = (f"shard({num_samples}, rank={rank}, world_size={world_size}, epoch={epoch}, seed={seed}) gave "
            f"{got[:8]}{' ...' if len(got) > 8 else ''}, DistributedSampler gives {want[:8]}"
            f"{' ...' if len(want) > 8 else ''}.")
    per_rank = math.ceil(num_samples / world_size)
    if len(got) != len(want):
        if len(got) < len(want):
            return head + (f" {len(got)} indices, not ceil({num_samples} / {world_size}) = {per_rank}: no padding? "
                           "Every rank must get the same number of indices (else one rank takes a step fewer "
                           "and the others wait for it in an all-reduce): repeat the first indices of the "
                           f"shuffled order until there are {per_rank * world_size}, then split")
        return head + (f" {len(got)} indices, not ceil({num_samples} / {world_size}) = {per_rank}: pad only up "
                       "to the next multiple of world_size, and take every world_size-th index")
    other_seed = next((s for s in (seed + epoch + rank, seed + rank) if rank and s != seed + epoch
                       and got == torch_shard(num_samples, rank, world_size, 0, s)), None)
    if other_seed is not None:
        return head + (f" That is the order of generator seed {other_seed}, not seed + epoch = {seed + epoch}: "
                       "is the rank in the seed? Every rank must shuffle identically (seed + epoch only), "
                       "else the shards overlap and miss samples")
    for other in range(4):
        if other != epoch and got == torch_shard(num_samples, rank, world_size, other, seed):
            return head + (f" These are the indices of epoch {other}: the order does not change with the epoch "
                           "as it should; seed the generator with seed + epoch (what set_epoch does), the "
                           "same on every rank")
    if sorted(got) == list(range(rank * per_rank, min((rank + 1) * per_rank, num_samples))) or got == sorted(got):
        return head + (" Not shuffled (or a contiguous block): shuffle with torch.randperm(num_samples, "
                       "generator=g), g seeded with seed + epoch, then take every world_size-th index "
                       "from rank on")
    if sorted(got) == sorted(want):
        return head + (" The same indices in another order: shuffle with torch.randperm(num_samples, "
                       "generator=g), g seeded with seed + epoch, pad, then take indices[rank::world_size]")
    return head + (" Shuffle with torch.randperm(num_samples, generator=g) (g seeded with seed + epoch), pad "
                   "with the first indices of that order, then take indices[rank::world_size]")


def shard_worker(rank: int, world_size: int, source: str, function: str, trace_dir: str) -> Report:
    """Every (size, epoch, seed) in ``CASES``: this rank's indices compared with DistributedSampler's."""
    with traced(rank, trace_dir, forbid=COLLECTIVES,
                reason="shard needs no communication: every rank computes the same permutation") as trace:
        fn = load_function(source, function)

        def case(num_samples: int, epoch: int, seed: int) -> str | None:
            want = torch_shard(num_samples, rank, world_size, epoch, seed)
            got = fn(num_samples, rank, world_size, epoch, seed)
            if isinstance(got, torch.Tensor):
                got = got.tolist()
            if not isinstance(got, (list, tuple)) or not all(isinstance(i, int) for i in got):
                return f"{function} returned {type(got).__name__}, not a list of int indices"
            got = list(got)
            return None if got == want else diagnose(got, want, num_samples, rank, world_size, epoch, seed)

        cases: list[Case] = [(f"{n} samples, epoch {epoch}, seed {seed}", lambda n=n, e=epoch, s=seed: case(n, e, s))
                             for n, epoch, seed in CASES]
        return run_cases(trace, cases)


EXERCISES = [
    Exercise(
        name="shard", number="7.1", lesson=7, notebook="07_ddp_spawn.ipynb",
        title="a DistributedSampler of your own: padding and a shuffle per epoch", level="medium",
        task=("Give rank r its indices of a data set of num_samples for one epoch, as DistributedSampler "
              "(shuffle=True) after set_epoch(epoch) does: one shuffled order, the same on every rank and "
              "new each epoch, padded so every rank gets ceil(num_samples / world_size) indices."),
        hint=("g = torch.Generator(); g.manual_seed(seed + epoch); torch.randperm(num_samples, generator=g). "
              "Pad by appending the first indices again; then indices[rank::world_size]."),
        checks=("12, 10, 7, 2 and 1 samples (uneven, fewer than ranks), epochs 0 to 5, seeds 0 and 42; each "
                "rank's indices compared with torch's DistributedSampler after set_epoch; collectives refused"),
        worker=shard_worker),
]
