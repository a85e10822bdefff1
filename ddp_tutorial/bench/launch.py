"""``bench launch``: a warm ``launch.spawn`` against plain ``torch.multiprocessing.spawn``.

Both do the same work: start 2 ranks, initialise a gloo group, all-reduce one
tensor, bring the results back to the parent. ``mp.spawn`` starts fresh
interpreters that import torch every time; ``launch.spawn`` forks them from a
server that imported torch once (see ``00_start_here``).
"""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
import torch.multiprocessing as tmp

from ddp_tutorial.bench.common import Result, timed
from ddp_tutorial.comm.hello import all_reduce_ranks
from ddp_tutorial.launch import LOCALHOST, free_port, spawn

if TYPE_CHECKING:  # matplotlib is imported only when a plot is drawn
    from matplotlib.axes import Axes

HELP = "warm launch.spawn vs torch.multiprocessing.spawn (2 ranks, init + all-reduce)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3)


def _mp_spawn_worker(rank: int, world_size: int, port: int, queue) -> None:
    """What ``mp.spawn`` runs: the set-up ``launch.spawn`` does for us, written out."""
    os.environ.update(MASTER_ADDR=LOCALHOST, MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        x = torch.tensor([float(rank)])
        dist.all_reduce(x)
        queue.put((rank, x.item()))
    finally:
        dist.destroy_process_group()


def run_mp_spawn(world_size: int) -> list:
    queue = tmp.get_context("spawn").SimpleQueue()
    tmp.spawn(_mp_spawn_worker, args=(world_size, free_port(), queue), nprocs=world_size, join=True)
    return [value for _, value in sorted(queue.get() for _ in range(world_size))]


def run_launch_spawn(world_size: int) -> list:
    return spawn(all_reduce_ranks, world_size, backend="gloo", quiet=True)


def run(args: argparse.Namespace) -> Result:
    n = args.world_size
    expected = [n * (n - 1) / 2] * n
    assert run_launch_spawn(n) == expected  # also warms the forkserver
    assert run_mp_spawn(n) == expected
    warm = timed(lambda: run_launch_spawn(n), repeat=args.repeat, warmup=0)
    plain = timed(lambda: run_mp_spawn(n), repeat=args.repeat, warmup=0)
    return Result(
        name=f"launch: {n} ranks, init + all_reduce + results back (best of {args.repeat})",
        columns=["launcher", "seconds"],
        rows=[{"launcher": "launch.spawn (warm forkserver)", "seconds": warm},
              {"launcher": "torch.multiprocessing.spawn", "seconds": plain}],
        ratios={"speedup (mp.spawn time / launch.spawn time)": plain / warm},
        notes=["target: speedup >= 10"],
    )


def plot(result: Result, ax: Axes) -> None:
    ax.bar([r["launcher"].split(" ")[0] for r in result.rows], [r["seconds"] for r in result.rows])
    ax.set_ylabel("seconds per launch")
    ax.set_title("launch cost, 2 ranks")
