"""Spawn targets for tests/sharding/test_zero.py and test_fsdp.py: several checks per launch, to keep them short."""

from __future__ import annotations

import torch.distributed as dist

from ddp_tutorial.sharding import fsdp, zero
from ddp_tutorial.sharding.fsdp import FORCE_SUM_AVAILABLE


def zero_checks(rank: int, world_size: int, stages: tuple[int, ...] = (1, 2)) -> dict:
    """ZeRO from scratch (each stage) against DDP + Adam and one process; ZeroRedundancyOptimizer against
    DDP + Adam on a model with a large embedding (uneven assignment); the bytes each rank holds."""
    return {"ours": {stage: zero.train_side_by_side(rank, world_size, stage) for stage in stages},
            "torch": zero.zero_redundancy_vs_adam(rank, world_size, model_kwargs={"vocab": 512}),
            "bytes": zero.footprints(rank, world_size)}


def fsdp_checks(rank: int, world_size: int, timelines: bool = False) -> dict:
    """FSDP2's gradients against DDP's (default reductions, and forced SUM where this torch has it),
    parameters after 3 steps against one process (both reshard_after_forward settings), its bytes,
    and with ``timelines`` what is gathered when."""
    result = {"grads": fsdp.gradients_vs_ddp(rank, world_size),
              "grads force sum": fsdp.gradients_vs_ddp(rank, world_size, True) if FORCE_SUM_AVAILABLE else None,
              "params": {flag: fsdp.train_vs_one_process(rank, world_size, reshard_after_forward=flag)
                         for flag in (True, False)},
              "bytes": fsdp.footprints(rank, world_size)}
    if timelines:
        result["timelines"] = {flag: fsdp.unsharded_timeline(rank, world_size, flag) for flag in (True, False)}
    dist.barrier()
    return result
