"""Bus bandwidth, and how to measure an all-reduce against ``dist.all_reduce`` (``06_ring_all_reduce``).

Definitions are those of nccl-tests: for a message of ``bytes`` that takes ``time``,
``algbw = bytes / time`` and, for all-reduce, ``busbw = algbw * 2 (n - 1) / n``
(what each rank's link really carries, comparable across world sizes). A one-thread
memory copy (``memcpy_bandwidth``) is the ceiling a loopback transport cannot beat.
``sweep`` times ``ring_all_reduce`` against ``dist.all_reduce`` over message sizes;
``python -m ddp_tutorial.bench allreduce`` runs a longer sweep of the same. ``sweep_report``
prints a sweep as the lesson reads it; ``ring_alpha_beta`` fits the ring's cost per step.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from ddp_tutorial.comm.ring import PIECE_BYTES, ring_all_reduce_flat
from ddp_tutorial.env import rank_device
from ddp_tutorial.launch import spawn

__all__ = ["KB", "MB", "HEADLINE", "bus_factor", "measure_worker", "memcpy_bandwidth", "sweep",
           "sweep_report", "ring_alpha_beta"]

KB, MB = 1 << 10, 1 << 20
HEADLINE = 16 * MB  # the size the benchmark's ratios are taken at: timed 5x as often


def bus_factor(world_size: int) -> float:
    """busbw / algbw for all-reduce: each rank moves 2 (n - 1) / n of the message."""
    return 2 * (world_size - 1) / world_size


def measure_worker(rank: int, world_size: int, sizes: list[int], repeat: int,
                   piece_bytes: int = PIECE_BYTES, max_calls: int = 100) -> list[dict]:
    """Best seconds per all-reduce of float32 messages, ring vs ``dist.all_reduce`` (slowest rank counts)."""
    on = rank_device()
    sync = torch.cuda.synchronize if on.type == "cuda" else (lambda: None)  # GPU ops are asynchronous
    rows = []
    for size in sizes:
        # Zeros stay zero however often they are summed (random values would grow to inf
        # over repeated in-place SUMs); the values do not change the cost of sending or adding.
        x = torch.zeros(size // 4, device=on)
        # Small messages: average over several calls, or the timer's resolution dominates.
        calls = max(1, min(max_calls, (4 * MB) // size))
        impls = {"ring": lambda: ring_all_reduce_flat(x, dist.ReduceOp.SUM, None, piece_bytes=piece_bytes),
                 "dist": lambda: dist.all_reduce(x)}
        best = {name: float("inf") for name in impls}
        for name, fn in impls.items():  # warm-up: connections, allocator
            fn()
        for i in range(repeat * (5 if size == HEADLINE else 1)):
            order = list(impls) if i % 2 == 0 else list(reversed(impls))  # alternate: fair under load
            for name in order:
                dist.barrier()
                start = time.perf_counter()
                for _ in range(calls):
                    impls[name]()
                sync()
                elapsed = torch.tensor([(time.perf_counter() - start) / calls], dtype=torch.float64,
                                       device=on)
                dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
                best[name] = min(best[name], elapsed.item())
        rows.append({"bytes": size, "ring_s": best["ring"], "dist_s": best["dist"]})
    return rows


def memcpy_bandwidth(nbytes: int = 64 * MB, repeat: int = 7) -> float:
    """Bytes per second of one-thread ``copy_`` between two buffers (best of ``repeat``)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        src, dst = torch.ones(nbytes // 4), torch.empty(nbytes // 4)
        dst.copy_(src)
        best = float("inf")
        for _ in range(repeat):
            start = time.perf_counter()
            dst.copy_(src)
            best = min(best, time.perf_counter() - start)
    finally:
        torch.set_num_threads(threads)
    return nbytes / best


def sweep(world_size: int, sizes: list[int], repeat: int = 5, piece_bytes: int = PIECE_BYTES,
          backend: str = "gloo", max_calls: int = 100) -> list[dict]:
    """One row per size with seconds, algbw and busbw (GB/s) of both implementations."""
    rows = spawn(measure_worker, world_size, args=(sizes, repeat, piece_bytes, max_calls),
                 backend=backend, timeout=600, quiet=True)[0]
    for row in rows:
        row["world_size"] = world_size
        for impl in ("ring", "dist"):
            algbw = row["bytes"] / row[f"{impl}_s"] / 1e9
            row[f"{impl}_busbw"] = algbw * bus_factor(world_size)
        row["ring/dist"] = row["ring_busbw"] / row["dist_busbw"]
    return rows


def _size(nbytes: int) -> str:
    return f"{nbytes // MB} MB" if nbytes >= MB else f"{nbytes // KB} KB"


def sweep_report(rows: list[dict], copy_gbps: float) -> str:
    """``sweep`` rows as a table, how time grows with 16x the bytes (small and large), and the
    gap to a memory copy of ``copy_gbps`` GB/s at the largest size."""
    lines = [f"{'ranks':>5} {'size':>8} {'ring us':>9} {'dist us':>9} {'ring busbw':>11} {'dist busbw':>11} "
             f"{'ring/dist':>9}"]
    for r in rows:
        lines.append(f"{r['world_size']:>5} {r['bytes']:>8} {1e6 * r['ring_s']:>9.0f} {1e6 * r['dist_s']:>9.0f} "
                     f"{r['ring_busbw']:>11.3f} {r['dist_busbw']:>11.3f} {r['ring/dist']:>9.2f}")
    lines.append("(us: microseconds per all-reduce; busbw in GB/s; ring/dist > 1: the ring was faster)")
    for n in sorted({r["world_size"] for r in rows}):
        t = {r["bytes"]: r for r in rows if r["world_size"] == n}
        sizes = sorted(t)
        growth = [f"{_size(a)} -> {_size(b)}: ring x{t[b]['ring_s'] / t[a]['ring_s']:.1f}, "
                  f"dist x{t[b]['dist_s'] / t[a]['dist_s']:.1f}"
                  for a, b in zip(sizes, sizes[1:]) if b == 16 * a and a in (sizes[0], sizes[-2])]
        lines.append(f"{n} ranks, 16x the bytes takes  " + ";  ".join(growth) + " as long")
    largest = max(r["bytes"] for r in rows)
    lines.append(f"memory copy, one thread: {copy_gbps:.2f} GB/s")
    for r in (r for r in rows if r["bytes"] == largest):
        lines.append(f"{r['world_size']} ranks at {_size(largest)}: gloo on loopback reaches {r['dist_busbw']:.2f} "
                     f"GB/s busbw, {copy_gbps / r['dist_busbw']:.1f}x below a memory copy")
    return "\n".join(lines)


def ring_alpha_beta(rows: list[dict], world_size: int) -> tuple[float, float]:
    """The ring's cost per step, ``alpha + bytes * beta``, fitted by least squares to ``sweep`` rows of
    ``world_size`` ranks: ``(alpha`` in seconds, ``beta`` in seconds per byte, the inverse bandwidth)."""
    mine = [r for r in rows if r["world_size"] == world_size]
    steps = 2 * (world_size - 1)
    a = torch.tensor([[1.0, r["bytes"] / world_size] for r in mine], dtype=torch.float64)
    t = torch.tensor([[r["ring_s"] / steps] for r in mine], dtype=torch.float64)
    alpha, beta = torch.linalg.lstsq(a, t).solution.squeeze(1).tolist()
    return alpha, beta
