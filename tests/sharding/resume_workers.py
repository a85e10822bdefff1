"""Spawn targets for tests/sharding/test_sharded_resume.py: keyword variants of ``train_with_checkpoints``."""

from __future__ import annotations

from ddp_tutorial.sharding.sharded_resume import train_with_checkpoints


def resume_forgetting_rng(rank: int, world_size: int, folder: str, steps: int) -> dict:
    """Resume from ``folder`` with a freshly seeded RNG instead of the saved one (the mistake)."""
    return train_with_checkpoints(rank, world_size, folder, steps, restore_rng=False)
