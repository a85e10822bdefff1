"""``bench dp``: DataParallel against DDP, training throughput on the same model and global batch.

Used by ``13_performance``. Three ways to spend the same cores on one training
step of ``DeepMLP`` (~1M parameters), global batch ``--batch-size``:

- ``single``: one process on one core (one torch thread): the baseline;
- ``DataParallel``: one process, one replica per device driven by Python threads
  (on GPUs ``nn.DataParallel``; on CPU ``data_parallel.MiniDataParallel``, the
  same scatter / replicate / parallel_apply / gather, because ``nn.DataParallel``
  without GPUs just calls the module);
- ``DDP``: ``--world-size`` processes, each with its share of the batch, gradients
  all-reduced.

    python -m ddp_tutorial.bench dp [--batch-size 128] [--world-size 2] [--plot dp.png]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

from ddp_tutorial.bench.common import Result
from ddp_tutorial.launch import spawn
from ddp_tutorial.models import DeepMLP

if TYPE_CHECKING:  # matplotlib is imported only when a plot is drawn
    from matplotlib.axes import Axes

HELP = "DataParallel (threads, 1 process) vs DDP (processes) training throughput, same model"


def _batch(size: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(size, 256, generator=g), torch.randint(0, 10, (size,), generator=g)


def _step_fn(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> Callable[[], None]:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        optimizer.step()

    return step


def _best_step(step: Callable[[], None], steps: int, repeat: int,
               sync: Callable[[], None] = lambda: None) -> tuple[float, float]:
    """(best seconds per step, CPU seconds this process used per wall second over all rounds)."""
    step()  # warm-up
    best, wall, cpu = float("inf"), 0.0, 0.0
    for _ in range(repeat):
        sync()
        start, start_cpu = time.perf_counter(), time.process_time()
        for _ in range(steps):
            step()
        sync()
        elapsed = time.perf_counter() - start
        wall, cpu = wall + elapsed, cpu + time.process_time() - start_cpu
        best = min(best, elapsed / steps)
    return best, cpu / wall


def ddp_step_seconds(rank: int, world_size: int, global_batch: int, steps: int,
                     repeat: int) -> tuple[float, float]:
    """Worker: (seconds per DDP step, slowest rank; cores used by all ranks together)."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from ddp_tutorial.env import rank_device

    device = rank_device()
    torch.manual_seed(0)
    model = DDP(DeepMLP().to(device), device_ids=[device.index] if device.type == "cuda" else None)
    x, y = _batch(global_batch)
    share = global_batch // world_size
    x, y = x[rank * share:(rank + 1) * share].to(device), y[rank * share:(rank + 1) * share].to(device)
    seconds, cores = _best_step(_step_fn(model, x, y), steps, repeat, lambda: dist.barrier())
    slowest = torch.tensor([seconds], dtype=torch.float64, device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    total = torch.tensor([cores], dtype=torch.float64, device=device)
    dist.all_reduce(total)
    return slowest.item(), total.item()


def local_step_seconds(kind: str, global_batch: int, replicas: int, steps: int,
                       repeat: int) -> tuple[float, float]:
    """(seconds per step, cores used) in this process: ``kind`` is ``"single"`` or ``"dp"``."""
    from ddp_tutorial.data_parallel.mini_dp import MiniDataParallel

    torch.manual_seed(0)
    model: nn.Module = DeepMLP()
    x, y = _batch(global_batch)
    previous = torch.get_num_threads()
    if kind == "single":
        torch.set_num_threads(1)  # the baseline: one core
    elif torch.cuda.device_count() >= replicas:
        model, x, y = nn.DataParallel(model.cuda(), list(range(replicas))), x.cuda(), y.cuda()
    else:
        torch.set_num_threads(1)  # the replica threads do the parallel work
        model = MiniDataParallel(model, ["cpu"] * replicas)
    sync = torch.cuda.synchronize if x.is_cuda else (lambda: None)
    try:
        return _best_step(_step_fn(model, x, y), steps, repeat, sync)
    finally:
        torch.set_num_threads(previous)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--world-size", type=int, default=2, help="DDP processes = DataParallel replicas")
    parser.add_argument("--batch-size", type=int, default=128, help="global batch, split over replicas")
    parser.add_argument("--steps", type=int, default=5, help="steps per timed round")
    parser.add_argument("--repeat", type=int, default=5, help="timed rounds (the best counts)")


def run(args: argparse.Namespace) -> Result:
    n, batch = args.world_size, args.batch_size
    seconds = {
        "single process, 1 core": local_step_seconds("single", batch, n, args.steps, args.repeat),
        f"DataParallel, {n} replicas (threads)": local_step_seconds("dp", batch, n, args.steps, args.repeat),
        f"DDP, {n} processes": spawn(ddp_step_seconds, n, args=(batch, args.steps, args.repeat),
                                     threads=1, timeout=600, quiet=True)[0],
    }
    rows = [{"setup": name, "step_ms": s * 1e3, "samples_per_s": batch / s, "cores_used": cores}
            for name, (s, cores) in seconds.items()]
    single, dp, ddp = (r["samples_per_s"] for r in rows)
    return Result(
        name=f"dp: DeepMLP (~1M params), global batch {batch}, {n} replicas/processes",
        columns=["setup", "step_ms", "samples_per_s", "cores_used"], rows=rows,
        ratios={"DDP throughput / DataParallel throughput": ddp / dp,
                "DDP throughput / single-process throughput": ddp / single},
        notes=["DataParallel replicates the model and gathers outputs every step, and its threads "
               "share one Python interpreter (the GIL); DDP pays one gradient all-reduce per step.",
               f"cores_used: CPU seconds per wall second of all its threads/processes (at most {n}). "
               "DataParallel near 1: its threads take turns holding the GIL; DDP below "
               f"{n}: its processes wait for the all-reduce, which on few cores cannot overlap compute"],
    )


def plot(result: Result, ax: Axes) -> None:
    names = [r["setup"].replace(", ", "\n") for r in result.rows]
    ax.bar(names, [r["samples_per_s"] for r in result.rows], color=["grey", "tab:orange", "tab:blue"])
    ax.set_ylabel("samples / s (higher is better)")
    ax.set_title("same model, same global batch")
    ax.tick_params(axis="x", labelsize=7)
