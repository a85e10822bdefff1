"""``bench pipeline``: a model split over two stages, naive versus cut into micro-batches.

The forward of ``ToyMpModel(width, width, width)`` on a batch, with each stage in
its own thread (one torch thread each on the CPU, one GPU each with
``--device cuda`` and two GPUs). Reports the wall time, the measured idle share
of the stages and the ideal bubble ``(S - 1) / (M + S - 1)`` (``09_model_parallel_ddp``).
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

import torch

from ddp_tutorial.bench.common import Result
from ddp_tutorial.pipeline_parallel.model_parallel import ToyMpModel
from ddp_tutorial.pipeline_parallel.pipeline import bubble_fraction, measure_pipeline

if TYPE_CHECKING:  # matplotlib is imported only when a plot is drawn
    from matplotlib.axes import Axes

HELP = "split model: naive two-stage forward vs micro-batch pipeline (wall time, idle share)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--micro", type=int, nargs="+", default=[1, 2, 4, 8, 16],
                        help="micro-batch counts; 1 is the naive split")
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                        help="cuda puts the stages on cuda:0 and cuda:1")


def run(args: argparse.Namespace) -> Result:
    devices = ("cuda:0", "cuda:1") if args.device == "cuda" else ("cpu", "cpu")
    torch.manual_seed(0)
    model = ToyMpModel(*devices, args.width, args.width, args.width)
    counts = sorted(set(args.micro) | {1})
    best: dict[int, dict] = {}
    for _ in range(args.repeat):  # round-robin, so a busy spell on the machine hits every M alike
        for m in counts:
            r = measure_pipeline(m, args.batch_size, repeat=1, model=model)
            if m not in best or r["seconds"] < best[m]["seconds"]:
                best[m] = r
    rows = [{"micro_batches": m, "ms": best[m]["seconds"] * 1e3, "idle": best[m]["idle"],
             "ideal_idle": bubble_fraction(2, m)} for m in counts]
    naive = rows[0]["ms"]
    for row in rows:
        row["speedup"] = naive / row["ms"]
    best = max(rows, key=lambda row: row["speedup"])
    ratios = {f"speedup with {r['micro_batches']} micro-batches": r["speedup"]
              for r in rows if r["micro_batches"] == 4}  # JSON has no NaN: leave it out if not run
    ratios[f"best speedup (M={best['micro_batches']})"] = best["speedup"]
    return Result(
        name=(f"pipeline: 2 stages on {devices}, batch {args.batch_size}, width {args.width} "
              f"(forward, best of {args.repeat})"),
        columns=["micro_batches", "ms", "idle", "ideal_idle", "speedup"],
        rows=rows,
        ratios=ratios,
        notes=["ideal speedup for M micro-batches and 2 balanced stages: 2M / (M + 1)"],
    )


def plot(result: Result, ax: Axes) -> None:
    m = [r["micro_batches"] for r in result.rows]
    ax.plot(m, [r["speedup"] for r in result.rows], "o-", label="measured")
    ax.plot(m, [2 * k / (k + 1) for k in m], "--", label="ideal 2M/(M+1)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("micro-batches M")
    ax.set_ylabel("speed-up over the naive split")
    ax.set_title("pipelining a 2-stage split")
    ax.legend()
