"""Spawn target for tests/pipeline_parallel/test_schedules.py: every schedule in one launch, to keep it short."""

from __future__ import annotations

import torch.distributed as dist

from ddp_tutorial.pipeline_parallel.one_f_one_b import hand_worker
from ddp_tutorial.pipeline_parallel.torch_schedules import SCHEDULES, runs_here, schedule_worker


def fits(name: str, world_size: int, num_micro: int) -> bool:
    """torch refuses DualPipeV with fewer micro-batches than stages (2 per rank)."""
    return name != "DualPipeV" or num_micro >= 2 * world_size


def every_schedule(rank: int, world_size: int, num_micro: int = 4) -> dict:
    """The hand-written GPipe and 1F1B, then each of torch's schedules, on the same model and batch."""
    results = {name: hand_worker(rank, world_size, name, num_micro) for name in ("gpipe", "1f1b")}
    for name in results:
        results[name]["stages"] = [rank]
    results.update({name: schedule_worker(rank, world_size, name, num_micro) for name in SCHEDULES
                    if runs_here(name, dist.get_backend()) and fits(name, world_size, num_micro)})
    dist.barrier()
    return results
