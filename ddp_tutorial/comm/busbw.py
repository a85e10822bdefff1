"""Bus bandwidth, and how to measure an all-reduce against ``dist.all_reduce`` (``05_ring_all_reduce``).

Definitions are those of nccl-tests: for a message of ``bytes`` that takes ``time``,
``algbw = bytes / time`` and, for all-reduce, ``busbw = algbw * 2 (n - 1) / n``
(what each rank's link really carries, comparable across world sizes). A one-thread
memory copy (``memcpy_bandwidth``) is the ceiling a loopback transport cannot beat.
``sweep`` times ``ring_all_reduce`` against ``dist.all_reduce`` over message sizes;
``python -m ddp_tutorial.bench allreduce`` runs a longer sweep of the same.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from ddp_tutorial.comm.ring import PIECE_BYTES, ring_all_reduce_flat
from ddp_tutorial.env import rank_device
from ddp_tutorial.launch import spawn

__all__ = ["KB", "MB", "HEADLINE", "bus_factor", "measure_worker", "memcpy_bandwidth", "sweep"]

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
