"""Spawn targets for tests/test_collectives.py that only a test needs."""

from __future__ import annotations

import torch
import torch.distributed as dist


def list_all_to_all_uneven(rank: int, world_size: int) -> str:
    """gloo's list-form all_to_all with parts of different sizes: the error text, or 'ok'."""
    inputs = [torch.full((j + 1,), float(rank)) for j in range(world_size)]
    outputs = [torch.empty(rank + 1) for _ in range(world_size)]
    try:
        dist.all_to_all(outputs, inputs)
    except RuntimeError as exc:
        return str(exc)
    return "ok"
