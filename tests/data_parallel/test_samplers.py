"""ddp_tutorial.data_parallel.samplers: DistributedSampler's padding, drop_last, and a validation metric counted once."""

from __future__ import annotations

import math

import pytest

from ddp_tutorial.data_parallel.samplers import SHARINGS, rank_batches, validation_counts
from ddp_tutorial.launch import spawn

pytestmark = pytest.mark.timeout(120)


def drawn(n: int, world_size: int, sharing: str, batch_size: int = 2) -> list[int]:
    return [i for rank in range(world_size) for batch in rank_batches(n, rank, world_size, sharing, batch_size)
            for i in batch]


@pytest.mark.parametrize("n, world_size", [(10, 3), (7, 2), (12, 4), (5, 8)])
def test_each_sharing_against_counting_by_hand(n, world_size):
    per_rank = math.ceil(n / world_size)
    padded = drawn(n, world_size, "DistributedSampler")
    assert len(padded) == per_rank * world_size and set(padded) == set(range(n))
    repeats = sorted(padded)
    for i in range(n):
        repeats.remove(i)
    assert repeats == sorted((list(range(n)) * world_size)[:per_rank * world_size - n])  # the first indices again
    trimmed = drawn(n, world_size, "DistributedSampler(drop_last=True)")
    assert sorted(trimmed) == list(range(n // world_size * world_size))  # no repeats, the tail never seen
    # DataLoader's drop_last works on each rank's batches, after the padding
    for batch_size in (1, 2, 3):
        loader = drawn(n, world_size, "DataLoader(drop_last=True)", batch_size)
        assert len(loader) == world_size * (per_rank // batch_size * batch_size)
    unpadded = drawn(n, world_size, "unpadded shard")
    assert sorted(unpadded) == list(range(n))  # every sample exactly once


def test_unknown_sharing_is_refused():
    with pytest.raises(ValueError, match="unknown sharing"):
        rank_batches(10, 0, 3, "round robin")


def test_only_the_unpadded_shards_count_every_validation_sample_once():
    correct = [True] * 7 + [False] * 3
    expected = {  # computed by hand from the indices each sharing reads
        "DistributedSampler": (7 + 2, 12),  # samples 0 and 1 (both right) counted twice
        "DistributedSampler(drop_last=True)": (7, 9),  # sample 9 never seen
        "DataLoader(drop_last=True)": (7 + 2, 12),  # 4 per rank are 2 full batches: nothing dropped
        "unpadded shard": (7, 10),
    }
    assert set(expected) == set(SHARINGS)
    for sharing, (right, counted) in expected.items():
        results = spawn(validation_counts, 3, args=(correct, sharing), timeout=90)
        assert [(r["correct"], r["counted"]) for r in results] == [(right, counted)] * 3, sharing
        seen = [i for r in results for i in r["indices"]]
        assert sum(correct[i] for i in seen) == right and len(seen) == counted
