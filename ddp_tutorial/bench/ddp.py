"""``bench ddp``: step time of the from-scratch DDPs against torch DDP (``07_ddp_from_scratch``).

A ~1M-parameter ``DeepMLP`` (0.92M in 32 tensors), 2 ranks (gloo on CPU, nccl on GPUs), SGD steps of
forward + backward + update. Rows: ``local`` (no communication at all: the floor),
torch DDP, ``BucketedDDP``, ``FlatDDP``, ``NaiveDDP``. The workers here also feed the
notebook's bucket-size sweep, latency/bandwidth fit and overlap timeline.

    python -m ddp_tutorial.bench ddp [--world-size 2] [--repeat 20] [--plot ddp.png]
"""

from __future__ import annotations

import argparse
import copy
import gc
import time

import torch
import torch.distributed as dist
from torch import nn

from ddp_tutorial.bench.common import Result
from ddp_tutorial.ddp_from_scratch import WRAPPERS, BucketedDDP, make_model
from ddp_tutorial.env import rank_device
from ddp_tutorial.launch import spawn

HELP = "BucketedDDP / FlatDDP / NaiveDDP vs torch DDP step time (~1M params, 2 ranks)"
KINDS = ("local", "torch", "bucketed", "flat", "naive")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=20, help="timed rounds; the kinds take turns")
    parser.add_argument("--steps", type=int, default=3, help="steps per kind and round")
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--bucket-cap-mb", type=float, default=None,
                        help="default: each DDP's own (25 MB, the first bucket 1 MB)")


def wrap(kind: str, model: nn.Module, bucket_cap_mb: float | None) -> nn.Module:
    """``kind``'s wrapper around ``model``. Torch DDP and ``BucketedDDP`` get the same caps:
    by default 25 MB with a 1 MB first bucket; an explicit cap applies to the first bucket
    too (torch DDP keeps its small first bucket only when ``bucket_cap_mb`` is not given).
    The edges can differ by a parameter: torch closes a bucket once it has reached its cap,
    ours before a parameter would push it past."""
    if kind == "local":
        return model
    if kind == "torch":
        return nn.parallel.DistributedDataParallel(model, bucket_cap_mb=bucket_cap_mb)
    if kind == "bucketed" and bucket_cap_mb is not None:
        return BucketedDDP(model, bucket_cap_mb=bucket_cap_mb, first_bucket_mb=None)
    return WRAPPERS[kind](model)


def _stepper(model: nn.Module, x: torch.Tensor, y: torch.Tensor):
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)

    def step() -> None:
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return step


def _batch(rank: int, n_in: int, n_out: int, batch_size: int, seed: int, device: torch.device):
    gen = torch.Generator().manual_seed(seed + rank)
    return (torch.randn(batch_size, n_in, generator=gen).to(device),
            torch.randn(batch_size, n_out, generator=gen).to(device))


def _take_turns(steppers: dict, steps: int, repeat: int, device: torch.device) -> dict[str, dict[str, float]]:
    """Time single steps of each stepper, taking turns round by round so that noise from other
    programs hits them alike; ``best`` (the least disturbed step) and ``median`` seconds."""
    seen: dict = {k: [] for k in steppers}
    for round_ in range(repeat + 1):  # round 0 warms up
        for k, step in steppers.items():
            dist.barrier()
            for _ in range(steps):
                start = time.perf_counter()
                step()
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                if round_:
                    seen[k].append(time.perf_counter() - start)
    return {k: {"best": min(v), "median": sorted(v)[len(v) // 2]} for k, v in seen.items()}


def step_times(rank: int, world_size: int, kinds: tuple[str, ...] = KINDS, steps: int = 5, repeat: int = 7,
               batch_size: int = 32, bucket_cap_mb: float | None = None,
               seed: int = 0) -> dict[str, dict[str, float]]:
    """Seconds per training step of each kind (see ``KINDS``): ``best`` and ``median``."""
    device = rank_device()
    base, (n_in, n_out) = make_model("big", seed)
    x, y = _batch(rank, n_in, n_out, batch_size, seed, device)
    steppers = {k: _stepper(wrap(k, copy.deepcopy(base).to(device), bucket_cap_mb), x, y) for k in kinds}
    result = _take_turns(steppers, steps, repeat, device)
    del steppers
    gc.collect()
    return result


def allreduce_times(rank: int, world_size: int, numels: list[int], repeat: int = 15) -> list[float]:
    """Best seconds of one blocking all-reduce of a float32 tensor of each size."""
    device = rank_device()
    out = []
    for n in numels:
        t = torch.ones(n, device=device)
        best = float("inf")
        for i in range(repeat + 1):
            dist.barrier()
            start = time.perf_counter()
            dist.all_reduce(t)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            if i:
                best = min(best, time.perf_counter() - start)
        out.append(best)
    return out


def bucket_sweep(rank: int, world_size: int, caps_mb: list[float], steps: int = 3, repeat: int = 5,
                 batch_size: int = 32, seed: int = 0, comm_repeat: int = 10) -> list[dict[str, float]]:
    """For each bucket cap: the number of buckets, BucketedDDP's best step time, and the time of its
    buckets' all-reduces done one after another with nothing to overlap (communication alone)."""
    device = rank_device()
    base, (n_in, n_out) = make_model("big", seed)
    x, y = _batch(rank, n_in, n_out, batch_size, seed, device)
    models = {cap: BucketedDDP(copy.deepcopy(base).to(device), bucket_cap_mb=cap) for cap in caps_mb}
    steps_seen = _take_turns({cap: _stepper(m, x, y) for cap, m in models.items()}, steps, repeat, device)
    rows = []
    for cap, ddp in models.items():
        comm = float("inf")
        for i in range(comm_repeat + 1):
            dist.barrier()
            start = time.perf_counter()
            for flat in ddp.flat_buckets:
                dist.all_reduce(flat)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            if i:
                comm = min(comm, time.perf_counter() - start)
        rows.append({"bucket_cap_mb": cap, "buckets": len(ddp.buckets),
                     "bytes": sum(f.numel() * f.element_size() for f in ddp.flat_buckets),
                     "step": steps_seen[cap]["best"], "comm": comm})
    del models
    gc.collect()
    return rows


def fit_overhead_model(calls: list[float], nbytes: list[float], seconds: list[float]) -> tuple[float, float]:
    """Least-squares fit of ``seconds = calls * latency + bytes / bandwidth``; returns (latency s, bandwidth B/s).

    The fit minimises *relative* errors (each row divided by its measured time), so
    one slow, noisy point cannot outweigh the small ones. Neither constant may be
    negative: when noise pushes one below zero it is fixed at zero (bandwidth
    infinite) and the other one is fitted alone.
    """
    weight = 1.0 / torch.tensor(seconds, dtype=torch.float64).unsqueeze(1)
    a = torch.tensor([calls, nbytes], dtype=torch.float64).T * weight
    b = torch.tensor(seconds, dtype=torch.float64).unsqueeze(1) * weight
    latency, inv_bw = torch.linalg.lstsq(a, b).solution.squeeze(1).tolist()
    if latency < 0:
        latency, inv_bw = 0.0, torch.linalg.lstsq(a[:, 1:], b).solution.item()
    elif inv_bw <= 0:
        latency, inv_bw = torch.linalg.lstsq(a[:, :1], b).solution.item(), 0.0
    return latency, (1.0 / inv_bw if inv_bw > 0 else float("inf"))


def timeline(rank: int, world_size: int, bucket_cap_mb: float = 1.0, batch_size: int = 32,
             num_steps: int = 10, seed: int = 0) -> dict:
    """A recorded BucketedDDP backward: when each gradient was ready, when each bucket's all-reduce
    started and finished, in seconds from the start of backward. Of ``num_steps`` steps the one
    that was slowest on no rank is kept: the least disturbed by other programs."""
    device = rank_device()
    model, (n_in, n_out) = make_model("big", seed)
    ddp = BucketedDDP(model.to(device), bucket_cap_mb=bucket_cap_mb, record_events=True)
    x, y = _batch(rank, n_in, n_out, batch_size, seed, device)
    records = []
    for step in range(2 + num_steps):  # 2 warm-up steps
        loss = nn.functional.mse_loss(ddp(x), y)
        dist.barrier()
        start = time.perf_counter()
        loss.backward()
        end = time.perf_counter()
        if step >= 2:
            records.append((end - start, [(kind, index, t - start) for kind, index, t in ddp.events]))
    slowest = torch.tensor([r[0] for r in records], dtype=torch.float64, device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    backward, events = records[int(slowest.argmin())]
    result = {"events": events, "backward": backward, "buckets": ddp.buckets,
              "names": [name for name, _ in model.named_parameters()]}
    del ddp
    gc.collect()
    return result


def run(args: argparse.Namespace) -> Result:
    n = args.world_size
    per_rank = spawn(step_times, n, args=(KINDS, args.steps, args.repeat, args.batch_size, args.bucket_cap_mb),
                     timeout=600, quiet=True)
    # A step ends for everyone at the last all-reduce, so take the slowest rank.
    best = {k: max(r[k]["best"] for r in per_rank) for k in KINDS}
    median = {k: max(r[k]["median"] for r in per_rank) for k in KINDS}
    names = {"local": "no communication (floor)", "torch": "torch DDP", "bucketed": "BucketedDDP",
             "flat": "FlatDDP", "naive": "NaiveDDP"}
    buckets = ("default buckets (25 MB, first 1 MB)" if args.bucket_cap_mb is None
               else f"bucket_cap_mb={args.bucket_cap_mb:g} for every bucket")
    rows = [{"model": names[k], "best ms/step": 1e3 * best[k], "median ms/step": 1e3 * median[k],
             "best / torch DDP": best[k] / best["torch"]} for k in KINDS]
    return Result(
        name=f"ddp: DeepMLP 0.92M params in 32 tensors, {n} ranks, batch {args.batch_size}/rank, "
             f"{buckets} ({args.repeat} rounds x {args.steps} steps)",
        columns=["model", "best ms/step", "median ms/step", "best / torch DDP"],
        rows=rows,
        ratios={"BucketedDDP / torch DDP": best["bucketed"] / best["torch"],
                "NaiveDDP / BucketedDDP": best["naive"] / best["bucketed"],
                "FlatDDP / BucketedDDP": best["flat"] / best["bucketed"]},
        notes=["target: BucketedDDP / torch DDP <= 1.15; NaiveDDP slower than BucketedDDP",
               "ratios use the best step of each; on a busy machine the medians are noisy"],
    )


# Bar labels: a row's name, shortened where it is long (its first word alone would read "no").
SHORT_LABELS = {"no communication (floor)": "floor\n(no comm.)", "torch DDP": "torch\nDDP"}


def plot(result: Result, ax) -> None:
    ax.bar([SHORT_LABELS.get(r["model"], r["model"]) for r in result.rows], [r["best ms/step"] for r in result.rows])
    ax.set_ylabel("ms per step")
    ax.set_title("DDP step time, ~1M params")
