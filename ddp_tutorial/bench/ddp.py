"""``bench ddp``: step time of the from-scratch DDPs against torch DDP (``08_ddp_from_scratch``).

A ~1M-parameter ``DeepMLP`` (0.92M in 32 tensors), 2 ranks (gloo on CPU, nccl on GPUs), SGD steps of
forward + backward + update. Rows: ``local`` (no communication at all: the floor),
torch DDP, ``BucketedDDP``, ``FlatDDP``, ``NaiveDDP``. The lesson's own measurements
(exposed communication, the overlap timeline, the bucket-size sweep) are in
``ddp_tutorial.data_parallel.overlap`` and ``ddp_tutorial.data_parallel.buckets``; this one shares their step and timer.

    python -m ddp_tutorial.bench ddp [--world-size 2] [--repeat 20] [--plot ddp.png]
"""

from __future__ import annotations

import argparse
import copy
import gc
from typing import TYPE_CHECKING

from torch import nn

from ddp_tutorial.bench.common import Result
from ddp_tutorial.data_parallel.ddp_from_scratch import WRAPPERS, BucketedDDP
from ddp_tutorial.data_parallel.overlap import rank_batch, stepper
from ddp_tutorial.env import rank_device
from ddp_tutorial.launch import spawn
from ddp_tutorial.models import make_model
from ddp_tutorial.timing import take_turns

if TYPE_CHECKING:  # matplotlib is imported only when a plot is drawn
    from matplotlib.axes import Axes

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


def step_times(rank: int, world_size: int, kinds: tuple[str, ...] = KINDS, steps: int = 5, repeat: int = 7,
               batch_size: int = 32, bucket_cap_mb: float | None = None,
               seed: int = 0) -> dict[str, dict[str, float]]:
    """Seconds per training step of each kind (see ``KINDS``): ``best`` and ``median``."""
    device = rank_device()
    base, (n_in, n_out) = make_model("big", seed)
    x, y = rank_batch(rank, n_in, n_out, batch_size, seed, device)
    steppers = {k: stepper(wrap(k, copy.deepcopy(base).to(device), bucket_cap_mb), x, y) for k in kinds}
    result = take_turns(steppers, steps, repeat, device)
    del steppers
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


def plot(result: Result, ax: Axes) -> None:
    ax.bar([SHORT_LABELS.get(r["model"], r["model"]) for r in result.rows], [r["best ms/step"] for r in result.rows])
    ax.set_ylabel("ms per step")
    ax.set_title("DDP step time, ~1M params")
