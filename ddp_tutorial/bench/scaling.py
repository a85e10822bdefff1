"""``bench train``: training throughput of 2 processes over 1 process, one thread each.

The same ``train.build`` as ``python -m ddp_tutorial.training.train`` (DDP, DistributedSampler,
SGD), timed in the workers after a warm-up: samples per second summed over ranks,
best of ``--repeat`` windows per launch, median of
``--rounds`` launches that alternate between 1 and 2 processes. Perfect scaling is 2x (efficiency 1.0); the cost of
all-reducing the gradients every step is what keeps it below. Used by
``13_performance`` and ``11_train_end_to_end``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ddp_tutorial.bench.common import Result
from ddp_tutorial.env import rank_device
from ddp_tutorial.launch import spawn
from ddp_tutorial.training.train import TrainConfig, build

if TYPE_CHECKING:  # matplotlib is imported only when a plot is drawn
    from matplotlib.axes import Axes

HELP = "DDP training throughput, 2 processes vs 1 (one thread each), digits and fake 32x32"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps", type=int, default=30, help="timed steps per window")
    parser.add_argument("--repeat", type=int, default=2, help="timed windows per launch; the best one counts")
    parser.add_argument("--rounds", type=int, default=3,
                        help="launches of each variant, taking turns; the median counts")
    # 256: at the training default (32) a digits step is ~2 ms of compute, and the per-step
    # all-reduce latency, not the arithmetic, would decide the ratio
    parser.add_argument("--digits-batch-size", type=int, default=256, help="per process")
    parser.add_argument("--fake-batch-size", type=int, default=32, help="per process")
    parser.add_argument("--fake-samples", type=int, default=1024, help="FakeData training images")


def measure(rank: int, world_size: int, config: TrainConfig, steps: int, repeat: int, sync: bool = True) -> dict:
    """Worker: warm up, then time ``repeat`` windows of ``steps`` optimizer steps; samples/s over all ranks.

    ``sync=False`` trains the bare model (no gradient all-reduce): a control that
    shows how much parallelism the machine itself allows right now.
    """
    device = rank_device()
    setup = build(config, rank, world_size, device)
    setup.ddp.train()

    def batches():
        epoch = 0
        while True:
            setup.train_loader.sampler.set_epoch(epoch)
            yield from setup.train_loader
            epoch += 1

    source = batches()

    def step() -> None:
        x, y = next(source)
        setup.optimizer.zero_grad(set_to_none=True)
        net = setup.ddp if sync else setup.model
        F.cross_entropy(net(x.to(device)), y.to(device)).backward()
        setup.optimizer.step()

    for _ in range(5):
        step()
    best, cpu_share = float("inf"), 0.0
    for _ in range(repeat):
        dist.barrier()
        start, cpu_start = time.perf_counter(), time.process_time()
        for _ in range(steps):
            step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # kernels are asynchronous: time their end
        seconds = time.perf_counter() - start
        # on the rank's device: a world of one on a GPU is NCCL, which carries no CPU tensors
        elapsed = torch.tensor([seconds], dtype=torch.float64, device=device)
        # CPU time over wall time: below ~0.9 the rank waited for a core (a busy machine), or for its peer
        share = torch.tensor([(time.process_time() - cpu_start) / seconds], dtype=torch.float64, device=device)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the slowest rank sets the pace
        dist.all_reduce(share, op=dist.ReduceOp.MIN)
        if elapsed.item() < best:
            best, cpu_share = elapsed.item(), share.item()
    samples = steps * config.batch_size * world_size
    return {"samples_per_s": samples / best, "ms_per_step": 1000 * best / steps, "cpu_share": cpu_share}


def run(args: argparse.Namespace) -> Result:
    # deterministic=False: the fast kernels (cudnn.benchmark) on a GPU; throughput is what counts here
    cases = [("digits", TrainConfig(dataset="digits", batch_size=args.digits_batch_size, log=False,
                                    deterministic=False), args.steps),
             ("fake 32x32", TrainConfig(dataset="fake", num_samples=args.fake_samples, image_size=32,
                                        batch_size=args.fake_batch_size, log=False, deterministic=False), args.steps)]
    rows, ratios, notes = [], {}, []
    for name, config, steps in cases:
        variants = {"1": (1, True), "2 (DDP)": (2, True), "2 (no all-reduce)": (2, False)}
        samples = {key: [] for key in variants}
        shares = {key: [] for key in variants}
        # the variants take turns, so a neighbour's burst of load hits each alike
        for _ in range(args.rounds):
            for key, (world_size, sync) in variants.items():
                out = spawn(measure, world_size, args=(config, steps, args.repeat, sync), threads=1, quiet=True,
                            timeout=600)[0]
                samples[key].append(out["samples_per_s"])
                shares[key].append(out["cpu_share"])
        rates = {key: statistics.median(values) for key, values in samples.items()}
        for key, (world_size, _sync) in variants.items():
            rows.append({"data": name, "processes": key, "batch/process": config.batch_size,
                         "samples/s": rates[key],
                         "ms/step": 1000 * config.batch_size * world_size / rates[key],
                         "cpu/wall": statistics.median(shares[key])})
        ratios[f"{name}: 2 procs without all-reduce / 1 proc (what the machine allows)"] = \
            rates["2 (no all-reduce)"] / rates["1"]
        ratio = rates["2 (DDP)"] / rates["1"]
        ratios[f"{name}: throughput 2 procs / 1 proc"] = ratio
        ratios[f"{name}: 2 procs with / without all-reduce (cost of DDP's sync)"] = \
            rates["2 (DDP)"] / rates["2 (no all-reduce)"]
        notes.append(f"{name}: scaling efficiency {ratio / 2:.0%} (ratio / 2 processes)")
    notes.append(f"median of {args.rounds} alternating rounds; target: ratio >= 1.6 on both; "
                 "one thread per process, CPU, gloo")
    notes.append("cpu/wall: the least CPU time per wall second of any rank; well below 1, the machine was busy")
    notes.append("'2 (no all-reduce)' trains without DDP's gradient sync: if it does not reach ~2x either, "
                 "the cores were not free and the DDP ratio is not a property of DDP")
    return Result(name="train: DDP training throughput, 1 thread per process",
                  columns=["data", "processes", "batch/process", "samples/s", "ms/step", "cpu/wall"],
                  rows=rows, ratios=ratios, notes=notes)


def plot(result: Result, ax: Axes) -> None:
    names = list(dict.fromkeys(r["data"] for r in result.rows))
    keys = list(dict.fromkeys(r["processes"] for r in result.rows))
    width = 0.8 / len(keys)
    for i, key in enumerate(keys):
        values = [next(r["samples/s"] for r in result.rows if r["data"] == n and r["processes"] == key)
                  for n in names]
        ax.bar([j + (i - (len(keys) - 1) / 2) * width for j in range(len(names))], values, width,
               label=f"{key} process{'es' if key != '1' else ''}")
    ax.set_xticks(range(len(names)), names)
    ax.set_yscale("log")
    ax.set_ylabel("training samples/s")
    ax.set_title("DDP training throughput")
    ax.legend(fontsize=8)
