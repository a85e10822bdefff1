"""Spawn targets for tests/expert_parallel that only a test needs."""

from __future__ import annotations

from ddp_tutorial.expert_parallel.dispatch import ep_worker
from ddp_tutorial.expert_parallel.routing import MoESetup


def many_setups(rank: int, world_size: int, setups: list[MoESetup]) -> list[dict]:
    """``ep_worker`` for each setup in turn, in one launch: one process group, many layers."""
    return [ep_worker(rank, world_size, setup) for setup in setups]
