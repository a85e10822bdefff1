"""Spawn targets for tests/test_portable.py (spawned functions must live in an importable module)."""

from __future__ import annotations

import torch


def cpu_capability(rank: int, world_size: int) -> str:
    return torch.backends.cpu.get_cpu_capability()
