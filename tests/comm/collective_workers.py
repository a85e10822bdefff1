"""Spawn targets for tests/comm/test_collectives.py that only a test needs."""

from __future__ import annotations

import torch
import torch.distributed as dist


def list_all_to_all_uneven(rank: int, world_size: int) -> str | list[list[float]]:
    """gloo's list-form all_to_all with parts of different sizes: the error text, or what arrived."""
    inputs = [torch.full((j + 1,), float(rank)) for j in range(world_size)]
    outputs = [torch.empty(rank + 1) for _ in range(world_size)]
    try:
        dist.all_to_all(outputs, inputs)
    except RuntimeError as exc:
        return str(exc)
    return [t.tolist() for t in outputs]


def flat_forms_warnings(rank: int, world_size: int) -> list[str]:
    """collectives' flat workers, with every warning recorded: a deprecated torch name would warn."""
    import warnings

    from ddp_tutorial.comm import collectives as c

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        c.all_gather_flat(rank, world_size)
        c.reduce_scatter_flat(rank, world_size)
    return [str(w.message) for w in caught]
