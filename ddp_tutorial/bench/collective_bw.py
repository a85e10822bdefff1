"""``bench collectives``: time, algbw and busbw of every collective, as nccl-tests reports them.

Used by ``13_performance``. For each collective, message size and world size:

- ``time``: seconds per call (best of ``--repeat`` rounds of ``--iters`` calls, the
  slowest rank's);
- ``algbw = size / time``, where ``size`` is the bytes of the full buffer
  (for all_gather, gather: the gathered output; for reduce_scatter, scatter,
  all_to_all: the full input);
- ``busbw = algbw x factor``: the nccl-tests correction that makes every
  collective comparable with the link speed (``2(n-1)/n`` for all_reduce,
  ``(n-1)/n`` for all_gather, reduce_scatter, all_to_all, gather, scatter; ``1`` for
  broadcast, reduce and send/recv).

Then an alpha-beta fit per collective, ``time = alpha + size / bandwidth``: alpha is
the latency of one call, bandwidth the algbw for huge messages.

    python -m ddp_tutorial.bench collectives [--world-sizes 2 4] [--max-bytes 4194304] [--plot c.png]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from ddp_tutorial.bench.common import Result
from ddp_tutorial.comm.collectives import all_gather_single, reduce_scatter_single  # this torch's names
from ddp_tutorial.launch import spawn

if TYPE_CHECKING:  # matplotlib is imported only when a plot is drawn
    from matplotlib.axes import Axes

HELP = "time, algbw, busbw of every collective over sizes and world sizes, with an alpha-beta fit"
OPS = ("all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "all_to_all",
       "gather", "scatter", "sendrecv")
COLUMNS = ["collective", "ranks", "bytes", "time_us", "algbw_GBps", "factor", "busbw_GBps"]


def bus_factor(op: str, world_size: int) -> float:
    """nccl-tests' busbw / algbw for ``op`` on ``world_size`` ranks."""
    n = world_size
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all", "gather", "scatter"):
        return (n - 1) / n
    if op in ("broadcast", "reduce", "sendrecv"):
        return 1.0
    raise ValueError(f"unknown collective {op!r}; known: {', '.join(OPS)}")


def _call(op: str, nbytes: int, rank: int, n: int, device: torch.device) -> Callable[[], None]:
    """One call of ``op`` on a buffer of ``nbytes`` (float32), with its tensors made in advance."""
    full = torch.ones(nbytes // 4, device=device)
    chunk = torch.ones(nbytes // 4 // n, device=device)
    pieces = [torch.empty_like(chunk) for _ in range(n)]
    calls = {
        "all_reduce": lambda: dist.all_reduce(full),
        "broadcast": lambda: dist.broadcast(full, src=0),
        "reduce": lambda: dist.reduce(full, dst=0),
        "all_gather": lambda: all_gather_single(full, chunk),
        "reduce_scatter": lambda: reduce_scatter_single(chunk, full),
        "all_to_all": lambda: dist.all_to_all_single(torch.empty_like(full), full),
        "gather": lambda: dist.gather(chunk, pieces if rank == 0 else None, dst=0),
        "scatter": lambda: dist.scatter(chunk, pieces if rank == 0 else None, src=0),
    }
    if op != "sendrecv":
        return calls[op]
    inbox = torch.empty_like(full)

    def sendrecv() -> None:  # every rank sends to the next and receives from the previous
        ops = [dist.P2POp(dist.isend, full, (rank + 1) % n), dist.P2POp(dist.irecv, inbox, (rank - 1) % n)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()

    return sendrecv


def measure(rank: int, world_size: int, ops: list[str], sizes: list[int], iters: int = 5,
            repeat: int = 3) -> list[dict]:
    """Worker: seconds per call of each op and size, the slowest rank's, on every rank."""
    from ddp_tutorial.env import rank_device

    device = rank_device()
    rows = []
    for op in ops:
        for size in sizes:
            nbytes = max(4 * world_size, size // (4 * world_size) * 4 * world_size)  # splits evenly
            call = _call(op, nbytes, rank, world_size, device)
            call()  # warm-up: connections, buffers
            calls = max(iters, min(50, (1 << 20) // nbytes))  # small messages: more calls per round
            best = float("inf")
            for _ in range(repeat):
                dist.barrier()
                start = time.perf_counter()
                for _ in range(calls):
                    call()
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                best = min(best, (time.perf_counter() - start) / calls)
            slowest = torch.tensor([best], dtype=torch.float64, device=device)
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
            rows.append({"collective": op, "ranks": world_size, "bytes": nbytes,
                         "seconds": slowest.item()})
    return rows


def slowest(seconds: float, device: torch.device | str = "cpu") -> float:
    """The largest of every rank's ``seconds`` (a MAX all-reduce): a collective ends with its slowest rank."""
    t = torch.tensor([seconds], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def allreduce_seconds(nbytes: int, *, calls: int = 5, repeat: int = 3, device: torch.device | str = "cpu") -> float:
    """Seconds of one all-reduce of ``nbytes`` (float32) in the current group, the slowest rank's: after a
    warm-up call, the best of ``repeat`` rounds of ``calls`` calls (``bench roofline``, ``bench stepmodel``)."""
    buf = torch.ones(nbytes // 4, device=device)
    dist.all_reduce(buf)
    best = float("inf")
    for _ in range(repeat):
        dist.barrier()
        start = time.perf_counter()
        for _ in range(calls):
            dist.all_reduce(buf)
        if buf.device.type == "cuda":
            torch.cuda.synchronize(buf.device)
        best = min(best, (time.perf_counter() - start) / calls)
    return slowest(best, device)


def to_row(op: str, world_size: int, nbytes: int, seconds: float) -> dict:
    algbw = nbytes / seconds / 1e9
    factor = bus_factor(op, world_size)
    return {"collective": op, "ranks": world_size, "bytes": nbytes, "time_us": seconds * 1e6,
            "algbw_GBps": algbw, "factor": factor, "busbw_GBps": algbw * factor}


def fit_alpha_beta(nbytes: list[float], seconds: list[float]) -> tuple[float, float]:
    """``time = alpha + size / bandwidth`` fitted on relative error; returns (alpha s, bandwidth B/s).

    Relative error, so the small messages (latency) count as much as the big ones
    (bandwidth). Both stay non-negative: if the times do not grow with the size in
    the measured range, the bandwidth is reported as the best algbw seen (a lower bound).
    """
    size = torch.tensor(nbytes, dtype=torch.float64)
    t = torch.tensor(seconds, dtype=torch.float64)
    a = torch.stack([1 / t, size / t], dim=1)
    alpha, beta = torch.linalg.lstsq(a, torch.ones_like(t).unsqueeze(1)).solution.squeeze(1).tolist()
    if alpha < 0:  # latency below the resolution: fit the slope alone
        alpha, beta = 0.0, float((size / t).sum() / (size / t).square().sum())
    if beta <= 0:
        return alpha, float((size / t).max())
    return alpha, 1 / beta


def fits(rows: list[dict]) -> list[dict]:
    """The alpha-beta fit of every (collective, ranks) in ``rows``."""
    out = []
    for op, n in dict.fromkeys((r["collective"], r["ranks"]) for r in rows):
        mine = [r for r in rows if r["collective"] == op and r["ranks"] == n]
        alpha, bandwidth = fit_alpha_beta([r["bytes"] for r in mine], [r["time_us"] * 1e-6 for r in mine])
        # how far the line misses the worst point: large means the model does not describe the run
        miss = max(abs(alpha + r["bytes"] / bandwidth - r["time_us"] * 1e-6) / (r["time_us"] * 1e-6)
                   for r in mine)
        out.append({"collective": op, "ranks": n, "latency_us": alpha * 1e6,
                    "algbw_GBps": bandwidth / 1e9, "busbw_GBps": bandwidth / 1e9 * bus_factor(op, n),
                    "max_error": miss})
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--ops", nargs="+", choices=OPS, default=list(OPS))
    parser.add_argument("--min-bytes", type=int, default=4 * 1024)
    parser.add_argument("--max-bytes", type=int, default=4 * 1024 * 1024)
    parser.add_argument("--iters", type=int, default=5, help="calls per timed round (at least; more for small sizes)")
    parser.add_argument("--repeat", type=int, default=5, help="timed rounds (the best counts)")


def run(args: argparse.Namespace) -> Result:
    sizes, size = [], args.min_bytes
    while size <= args.max_bytes:
        sizes.append(size)
        size *= 4
    rows = []
    for n in args.world_sizes:
        measured = spawn(measure, n, args=(list(args.ops), sizes, args.iters, args.repeat),
                         threads=1, timeout=600, quiet=True)[0]
        rows += [to_row(r["collective"], n, r["bytes"], r["seconds"]) for r in measured]
    fitted = fits(rows)
    n_max = max(args.world_sizes)
    ratios = {}
    for f in fitted:
        if f["ranks"] == n_max:
            ratios[f"{f['collective']} latency us (fit, {n_max} ranks)"] = f["latency_us"]
            ratios[f"{f['collective']} busbw GB/s (fit, {n_max} ranks)"] = f["busbw_GBps"]
    notes = ["alpha-beta fits (time = latency + bytes / algbw):"]
    notes += [f"  {f['collective']:>14} {f['ranks']} ranks: latency {f['latency_us']:8.1f} us, "
              f"algbw {f['algbw_GBps']:6.2f} GB/s, busbw {f['busbw_GBps']:6.2f} GB/s, "
              f"worst miss {f['max_error']:.0%}" for f in fitted]
    return Result(name=f"collectives: {len(args.ops)} ops, {len(sizes)} sizes, ranks {args.world_sizes}, "
                       f"1 thread per rank", columns=COLUMNS, rows=rows, ratios=ratios, notes=notes)


def plot(result: Result, ax: Axes, ranks: int | None = None) -> None:
    """busbw against message size, one line per collective, for ``ranks`` (default: the most)."""
    ranks = ranks or max(r["ranks"] for r in result.rows)
    for op in dict.fromkeys(r["collective"] for r in result.rows):
        mine = [r for r in result.rows if r["collective"] == op and r["ranks"] == ranks]
        ax.plot([r["bytes"] for r in mine], [r["busbw_GBps"] for r in mine], marker="o", label=op)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("message size (bytes)")
    ax.set_yscale("log")  # latency-bound small messages rise with slope 1, then bandwidth flattens
    ax.set_ylabel("busbw (GB/s)")
    ax.set_title(f"collectives, {ranks} ranks")
    ax.legend(fontsize=7)


def plot_latency(result: Result, ax: Axes) -> None:
    """The fitted latency (alpha) of each collective, one bar per world size."""
    fitted = fits(result.rows)
    ops = list(dict.fromkeys(f["collective"] for f in fitted))
    sizes = sorted({f["ranks"] for f in fitted})
    width = 0.8 / len(sizes)
    for i, n in enumerate(sizes):
        values = {f["collective"]: f["latency_us"] for f in fitted if f["ranks"] == n}
        ax.bar([k + i * width for k in range(len(ops))], [values.get(op, 0) for op in ops], width,
               label=f"{n} ranks")
    ax.set_xticks([k + width * (len(sizes) - 1) / 2 for k in range(len(ops))], ops, rotation=45,
                  ha="right", fontsize=8)
    ax.set_ylabel("latency alpha (us)")
    ax.set_yscale("log")
    ax.set_title("fitted latency per call")
    ax.legend()
