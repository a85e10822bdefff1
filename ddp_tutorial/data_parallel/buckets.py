"""How big should a bucket be? Per-call latency against a late start (``08_ddp_from_scratch``).

With ``n`` buckets carrying ``S`` bytes in all, communication costs about
``n * latency + S / bandwidth``. Small buckets leave early, while backward still runs, but
pay the latency many times; one huge bucket pays it once and cannot leave before backward
is over. Three pieces measure the trade on this machine:

- ``allreduce_times``: one blocking all-reduce of each of several sizes;
- ``bucket_sweep``: for several bucket caps, ``BucketedDDP``'s step time and its buckets'
  all-reduces done back to back with nothing to overlap;
- ``fit_overhead_model``: the latency and bandwidth that explain those times best;
- ``bucket_study`` runs all three on 2 ranks, ``study_report`` prints it.
"""

from __future__ import annotations

import copy
import gc
import time

import torch
import torch.distributed as dist

from ddp_tutorial.data_parallel.ddp_from_scratch import BucketedDDP
from ddp_tutorial.data_parallel.overlap import rank_batch, stepper
from ddp_tutorial.env import rank_device
from ddp_tutorial.launch import spawn
from ddp_tutorial.models import make_model
from ddp_tutorial.timing import take_turns

__all__ = ["allreduce_times", "bucket_sweep", "fit_overhead_model", "bucket_study", "study_report"]


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
    x, y = rank_batch(rank, n_in, n_out, batch_size, seed, device)
    models = {cap: BucketedDDP(copy.deepcopy(base).to(device), bucket_cap_mb=cap) for cap in caps_mb}
    steps_seen = take_turns({cap: stepper(m, x, y) for cap, m in models.items()}, steps, repeat, device)
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


def bucket_study(numels: list[int], caps_mb: list[float], world_size: int = 2) -> dict:
    """``allreduce_times`` and ``bucket_sweep`` on ``world_size`` ranks (the slowest rank's times), and
    the model fitted to both: ``{"nbytes", "single", "rows", "latency", "bandwidth"}``."""
    single = [max(ts) for ts in zip(*spawn(allreduce_times, world_size, args=(numels,), timeout=120))]
    sweep = spawn(bucket_sweep, world_size, args=(caps_mb,), timeout=300)
    rows = [{key: max(rank_rows[i][key] for rank_rows in sweep) for key in sweep[0][i]} for i in range(len(caps_mb))]
    nbytes = [4 * n for n in numels]  # float32
    latency, bandwidth = fit_overhead_model([1] * len(numels) + [r["buckets"] for r in rows],
                                            nbytes + [r["bytes"] for r in rows], single + [r["comm"] for r in rows])
    return {"nbytes": nbytes, "single": single, "rows": rows, "latency": latency, "bandwidth": bandwidth}


def study_report(study: dict) -> str:
    """The fitted constants, one line per bucket cap, and the gap between two caps giving the same buckets."""
    lines = [f"fitted: latency {1e6 * study['latency']:.0f} us per all-reduce, "
             f"bandwidth {study['bandwidth'] / 1e9:.2f} GB/s"]
    for r in study["rows"]:
        lines.append(f"bucket_cap_mb={r['bucket_cap_mb']:>5}: {r['buckets']:2d} buckets, step {1e3 * r['step']:6.2f} ms, "
                     f"all-reduces alone {1e3 * r['comm']:6.2f} ms")
    by_layout: dict[tuple, list[dict]] = {}
    for r in study["rows"]:
        by_layout.setdefault((r["buckets"], r["bytes"]), []).append(r)
    for same in (rows for rows in by_layout.values() if len(rows) > 1):
        caps = " and ".join(f"{r['bucket_cap_mb']:g}" for r in same)
        steps = [r["step"] for r in same]
        lines.append(f"caps {caps} MB, the same buckets measured again: steps differ by "
                     f"{(max(steps) - min(steps)) / min(steps):.0%} (the noise)")
    return "\n".join(lines)
