"""Spawn targets for tests/sharding/test_zero.py, test_fsdp.py and test_zero3.py: several checks per launch, to keep them short."""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist

from ddp_tutorial.env import rank_device
from ddp_tutorial.models import LookupMLP
from ddp_tutorial.sharding import fsdp, fsdp_practice, zero, zero3, zero3_train
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


def zero3_checks(rank: int, world_size: int, cases: tuple) -> dict:
    """ZeRO-3 from scratch against one process (``zero3_train.side_by_side``), and on a hand-written model
    (``LookupMLP``): names kept, every ``.grad`` float32 and shaped as ``.data``, and equal to this
    rank's padded slice of one process's gradient on the global batch (mean of the per-rank losses)."""
    torch.manual_seed(0)
    device = rank_device()  # where the backend's collectives run (cuda with NCCL)
    reference = LookupMLP().to(device)
    model = zero3.Zero3(copy.deepcopy(reference), torch.bfloat16 if world_size == 4 else None)
    tokens = torch.arange(4 * world_size, device=device).remainder(5).view(world_size, 4)
    targets = torch.arange(4 * world_size, device=device).remainder(7).view(world_size, 4)
    loss = torch.nn.functional.cross_entropy(model(tokens[rank]).float(), targets[rank])
    loss.backward()
    model.finish_gradient_synchronization()
    sum(torch.nn.functional.cross_entropy(reference(tokens[r]), targets[r]) for r in range(world_size)).backward()
    gaps, kinds = {}, {}
    for (name, p), ref in zip(model.module.named_parameters(), reference.parameters()):
        want = ref.grad.reshape(-1) / world_size
        if ref.dim() >= 2:
            s = -(-ref.numel() // world_size)
            want = torch.nn.functional.pad(want, (0, s * world_size - ref.numel()))[rank * s:(rank + 1) * s]
        kinds[name] = (p.grad.dtype, tuple(p.grad.shape) == tuple(p.data.shape), tuple(p.data.shape))
        gaps[name] = (p.grad.reshape(-1) - want).abs().max().item()
    full = model.gather_full_params()
    return {"train": zero3_train.side_by_side(rank, world_size, cases), "grad gaps": gaps, "grad kinds": kinds,
            "full equal": all(torch.equal(full[n], p) for n, p in reference.named_parameters()),
            "names": list(full) == [n for n, _ in reference.named_parameters()]}


def practice_checks(rank: int, world_size: int) -> dict:
    """FSDP2 in practice (``fsdp_practice.practice_report``) with every ``reshard_after_forward`` this world
    size allows (an int needs 4 ranks: groups of 2)."""
    return fsdp_practice.practice_report(rank, world_size, (True, False) + ((2,) if world_size == 4 else ()))
