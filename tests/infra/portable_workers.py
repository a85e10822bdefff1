"""Spawn targets for tests/infra/test_portable.py (spawned functions must live in an importable module)."""

from __future__ import annotations

import torch


def cpu_capability(rank: int, world_size: int) -> str:
    return torch.backends.cpu.get_cpu_capability()


def device_of_a_group_without_backend(rank: int, world_size: int) -> tuple[str, str, str]:
    """A group made with no backend (what torch picks by itself): backend, config, ``env.rank_device()``."""
    import torch.distributed as dist

    from ddp_tutorial.env import rank_device

    dist.init_process_group(rank=rank, world_size=world_size)
    try:
        return dist.get_backend(), str(dist.get_backend_config()), str(rank_device())
    finally:
        dist.destroy_process_group()
