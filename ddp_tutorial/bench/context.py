"""``bench context``: ring attention against full attention, time and bytes per rank as N grows (``20_long_sequences``).

At a fixed sequence length, for each world size ``N`` and each of non-causal, causal with
contiguous shards and causal zig-zag: every rank times one forward and backward of ring
attention on its ``seq/N`` positions (best of ``--repeat``, after a warm-up) and counts the
bytes autograd saves for backward (``saved_tensors_hooks``, each storage once). ``N = 1`` is
full attention in one process (the ring's one step, no messages) and the row every ratio
divides by. The slowest and the fastest rank show the causal imbalance that zig-zag removes.
On gloo the K/V messages go through the loopback device and the ranks share the CPU's
cores, so the times measure the balance, not the speed-up a GPU per rank would give.

    python -m ddp_tutorial.bench context [--seq 1024] [--world-sizes 1 2 4] [--plot context.png]
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

import torch

from ddp_tutorial.bench.common import Result, timed
from ddp_tutorial.context_parallel.online_softmax import attend_block
from ddp_tutorial.context_parallel.ring_attention import (
    RingAttention,
    block_pairs,
    chunk_ids,
    qkv_inputs,
    shard_sequence,
)
from ddp_tutorial.env import rank_device
from ddp_tutorial.launch import spawn

if TYPE_CHECKING:  # matplotlib is imported only when a plot is drawn
    from matplotlib.axes import Axes

HELP = "ring attention vs full attention: time and saved bytes per rank as N grows; causal balance, zig-zag"
VARIANTS = (("full", False, "contiguous"), ("causal", True, "contiguous"), ("causal zig-zag", True, "zigzag"))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seq", type=int, default=1024, help="sequence length, a multiple of 2 x every world size")
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--head-dim", type=int, default=32)
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--repeat", type=int, default=5)


def saved_bytes(fn) -> int:
    """The bytes autograd keeps for backward while ``fn()`` runs (each storage once)."""
    seen: set[int] = set()
    total = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal total
        if t.untyped_storage().data_ptr() not in seen:
            seen.add(t.untyped_storage().data_ptr())
            total += t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return total


def compute_only(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rank: int, world_size: int, *, causal: bool,
                 layout: str) -> None:
    """This rank's block computations of the whole ring, without its messages (its own K/V stand in
    for the others': same shapes, so the same work): what the rank computes, apart from what it waits for."""
    mine = chunk_ids(rank, world_size, layout)
    qs, ks, vs = (t.chunk(len(mine), dim=2) for t in (q, k, v))
    for step in range(world_size):
        held = chunk_ids((rank - step) % world_size, world_size, layout)
        for a, b, diagonal in block_pairs(mine, held, causal=causal):
            attend_block(qs[a], ks[b], vs[b], diagonal=diagonal)


def measure_rank(rank: int, world_size: int, shape: tuple[int, int, int, int], repeat: int) -> list[dict]:
    """This rank's best time of forward + backward, of its forward's block computations alone, and its
    saved bytes, for each of ``VARIANTS``."""
    import torch.distributed as dist

    device, full = rank_device(), qkv_inputs(shape, torch.float32)
    rows = []
    for name, causal, layout in VARIANTS:
        q, k, v = (shard_sequence(t, rank, world_size, layout).to(device).requires_grad_() for t in full)

        def step() -> None:
            RingAttention.apply(q, k, v, causal, None, layout).sum().backward()
            if device.type == "cuda":
                torch.cuda.synchronize(device)

        dist.barrier()
        seconds = timed(step, repeat=repeat)
        compute = 0.0
        for turn in range(world_size):  # one rank at a time: the others' work would share its cores
            dist.barrier()
            if turn == rank:
                with torch.no_grad():
                    compute = timed(lambda: compute_only(q, k, v, rank, world_size, causal=causal, layout=layout),
                                    repeat=repeat)
        rows.append({"variant": name, "seconds": seconds, "compute": compute,
                     "bytes": saved_bytes(lambda: RingAttention.apply(q, k, v, causal, None, layout))})
    dist.barrier()
    return rows


def sdpa_one_process(shape: tuple[int, int, int, int], repeat: int) -> dict[str, dict]:
    """torch's ``scaled_dot_product_attention`` on the whole sequence, one process: time and saved bytes."""
    q, k, v = (t.requires_grad_() for t in qkv_inputs(shape, torch.float32))
    out = {}
    for name, causal, _ in VARIANTS:
        def attend(c: bool = causal) -> torch.Tensor:
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=c)

        out[name] = {"seconds": timed(lambda: attend().sum().backward(), repeat=repeat), "bytes": saved_bytes(attend)}
    return out


def run(args: argparse.Namespace) -> Result:
    shape = (1, args.heads, args.seq, args.head_dim)
    sizes = sorted(set(args.world_sizes))
    full = sdpa_one_process(shape, args.repeat)
    measured = {n: spawn(measure_rank, n, args=(shape, args.repeat), timeout=600, quiet=True) for n in sizes}
    rows = []
    for i, (name, _, _) in enumerate(VARIANTS):
        base = full[name]
        rows.append({"variant": name, "ranks": "SDPA", "time_ms": 1e3 * base["seconds"],
                     "saved_KiB": base["bytes"] / 1024, "bytes_vs_full": 1.0})
        for n in sizes:
            per_rank = [ranks[i] for ranks in measured[n]]
            compute = [r["compute"] for r in per_rank]
            rows.append({"variant": name, "ranks": n, "time_ms": 1e3 * max(r["seconds"] for r in per_rank),
                         "time_vs_full": max(r["seconds"] for r in per_rank) / base["seconds"],
                         "compute_ms_max": 1e3 * max(compute), "compute_ms_min": 1e3 * min(compute),
                         "imbalance": max(compute) / min(compute),
                         "saved_KiB": max(r["bytes"] for r in per_rank) / 1024,
                         "bytes_vs_full": max(r["bytes"] for r in per_rank) / base["bytes"]})
    top = max(sizes)

    def pick(variant: str, key: str) -> float:
        return next(r[key] for r in rows if r["variant"] == variant and r["ranks"] == top)

    return Result(
        name=f"context: ring attention, seq {args.seq}, {args.heads} heads x {args.head_dim}, float32, forward + backward",
        columns=["variant", "ranks", "time_ms", "time_vs_full", "compute_ms_max", "compute_ms_min", "imbalance",
                 "saved_KiB", "bytes_vs_full"],
        rows=rows,
        ratios={f"saved bytes per rank / full attention's, {top} ranks": pick("full", "bytes_vs_full"),
                f"causal contiguous slowest / fastest rank, {top} ranks": pick("causal", "imbalance"),
                f"causal zig-zag slowest / fastest rank, {top} ranks": pick("causal zig-zag", "imbalance")},
        notes=["SDPA: torch's attention on the whole sequence in one process; time: forward + backward of the "
               "slowest rank; compute: a rank's block computations alone (forward, no messages), the balance; "
               "bytes: what autograd saves for backward, per rank",
               "the ranks share this machine's cores: compare the ratios, not the times with another machine's"],
    )


def plot(result: Result, ax: Axes) -> None:
    for variant in dict.fromkeys(r["variant"] for r in result.rows):
        rows = [r for r in result.rows if r["variant"] == variant]
        rows = [r for r in rows if r["ranks"] != "SDPA"]
        ax.plot([r["ranks"] for r in rows], [r["imbalance"] for r in rows], marker="o", label=variant)
    ax.set_xlabel("ranks (N)")
    ax.set_ylabel("compute: slowest / fastest rank")
    ax.set_title(result.name.split(",")[0] + ": balance")
    ax.legend()
