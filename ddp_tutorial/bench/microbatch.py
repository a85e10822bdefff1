"""``bench pipeline``: a model split over two stages, naive versus cut into micro-batches; ``--schedules``:
every pipeline schedule's bubble and activations held (``19_pipeline_schedules``).

The forward of ``ToyMpModel(width, width, width)`` on a batch, with each stage in
its own thread (one torch thread each on the CPU, one GPU each with
``--device cuda`` and two GPUs). Reports the wall time, the measured idle share
of the stages and the ideal bubble ``(S - 1) / (M + S - 1)`` (``10_model_parallel_ddp``).

With ``--schedules`` it runs lesson 19's hand-written 1F1B and torch's seven schedules on p = 2
and 4 ranks and m = 4 and 8 micro-batches, each action a fixed sleep (equal stage times), and
reports the measured idle share next to the schedule's own ideal (its order on the ideal clock)
and interleaved 1F1B's ``(p - 1) / (v m + p - 1)``, and the peak of micro-batches a rank held
(in whole-rank micro-batches: a rank of ``v`` stages counts each ``1 / v``).
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

import torch

from ddp_tutorial.bench.common import Result
from ddp_tutorial.launch import spawn
from ddp_tutorial.pipeline_parallel.model_parallel import ToyMpModel
from ddp_tutorial.pipeline_parallel.one_f_one_b import hand_worker
from ddp_tutorial.pipeline_parallel.orders import bubble_fraction as schedule_bubble
from ddp_tutorial.pipeline_parallel.orders import idle_fraction as schedule_idle
from ddp_tutorial.pipeline_parallel.pipeline import bubble_fraction, measure_pipeline
from ddp_tutorial.pipeline_parallel.torch_schedules import SCHEDULES, ideal_run, runs_here, schedule_worker

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
    parser.add_argument("--schedules", action="store_true",
                        help="instead: every pipeline schedule's bubble and peak for p in {2, 4}, m in {4, 8}")
    parser.add_argument("--forward-ms", type=float, default=20.0,
                        help="--schedules: a rank's forward of one micro-batch (a sleep); its backward takes twice that")


def schedule_row(name: str, p: int, m: int, results: list[dict]) -> dict:
    """One run's row: its measured idle share next to its own ideal (``torch_schedules.ideal_run``:
    the schedule's order on the ideal clock) and interleaved 1F1B's formula, and its peaks."""
    v = 1 if name == "1F1B (hand)" else SCHEDULES[name][1]
    ideal = ideal_run("1F1B" if name == "1F1B (hand)" else name, p, m)
    return {"schedule": name, "p": p, "m": m, "v": v, "idle": schedule_idle([e for r in results for e in r["events"]]),
            "ideal": None if ideal is None else schedule_idle(ideal), "formula": schedule_bubble(p, m, v),
            "peak_rank0": results[0]["peak"] / v, "peak_last": results[-1]["peak"] / v}


def run_schedules(args: argparse.Namespace) -> Result:
    """Each schedule on p = 2, 4 ranks and m = 4, 8 micro-batches: measured idle share and peaks."""
    delays = {"F": args.forward_ms / 1e3, "B": 2 * args.forward_ms / 1e3}
    rows = []
    for p in (2, 4):
        for m in (4, 8):
            names = [n for n in SCHEDULES if runs_here(n, "gloo") and (n != "DualPipeV" or m >= 2 * p)]
            for name in ["1F1B (hand)", *names]:  # torch refuses DualPipeV with fewer micro-batches than stages
                worker, schedule = (hand_worker, "1f1b") if name == "1F1B (hand)" else (schedule_worker, name)
                rows.append(schedule_row(name, p, m, spawn(worker, p, args=(schedule, m, 2, 0, delays),
                                                           timeout=300, quiet=True)))
    gaps = [abs(r["idle"] - r["ideal"]) for r in rows if r["ideal"] is not None]
    return Result(
        name=f"pipeline schedules: idle share and activations held (F {args.forward_ms:g} ms, B twice, as sleeps)",
        columns=["schedule", "p", "m", "v", "idle", "ideal", "formula", "peak_rank0", "peak_last"],
        rows=rows,
        ratios={"largest |idle - ideal| (every schedule against its own ideal clock)": max(gaps, default=0.0)},
        notes=["ideal: the schedule's own order on an ideal clock (F = 1, B = 2, a split backward's halves 1 each, "
               "messages free); target: every measured idle within 0.1 of it on an idle machine",
               "formula: interleaved 1F1B's (p - 1) / (v m + p - 1); the zero-bubble schedules' ideal is about a "
               "third of its bubble (Qi et al. 2023, section 3)",
               "peaks: micro-batches from the timeline (forward done, last backward piece not), in whole-rank "
               "micro-batches: GPipe m, 1F1B p on rank 0 and 1 on the last rank"],
    )


def run(args: argparse.Namespace) -> Result:
    if args.schedules:
        return run_schedules(args)
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
    if "schedule" in result.columns:
        labels = [f"{r['schedule']} p{r['p']} m{r['m']}" for r in result.rows]
        ax.barh(labels, [r["idle"] for r in result.rows], label="measured idle")
        ax.plot([r["ideal"] if r["ideal"] is not None else float("nan") for r in result.rows], labels, "k|",
                markersize=12, label="its own ideal clock")
        ax.set_xlabel("idle share of ranks x time")
        ax.set_title("pipeline schedules")
        ax.legend()
        return
    m = [r["micro_batches"] for r in result.rows]
    ax.plot(m, [r["speedup"] for r in result.rows], "o-", label="measured")
    ax.plot(m, [2 * k / (k + 1) for k in m], "--", label="ideal 2M/(M+1)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("micro-batches M")
    ax.set_ylabel("speed-up over the naive split")
    ax.set_title("pipelining a 2-stage split")
    ax.legend()
