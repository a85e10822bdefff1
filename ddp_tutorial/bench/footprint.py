"""``bench sharding``: bytes per rank of DDP, ZeRO-1, ZeRO-2-style and FSDP2 for 1, 2 and 4 ranks (``14_sharding``).

Each strategy trains one float32 Adam step of a ``TinyTransformer`` (default: 8 blocks,
0.43M parameters) on N ranks; each rank reports the bytes its real tensors hold for
parameters, gradients and optimizer state (``to_local()`` of FSDP2's DTensors), and the
rank holding the most is kept. Rows give each total next to the textbook formula and as a
ratio to DDP's. FSDP2's ``peak`` adds what is gathered at the worst moment of a step: the
root and one block, their full parameters and gradients (activations aside). This measures
memory, not time: on gloo a reduce-scatter is an all-reduce of the whole buffer.

Lesson 18 adds ``ZeRO-3 (ours)`` (``sharding.zero3``: steady, and peak with the most it gathered
at once plus as many bytes of full gradients), FSDP2 under ``MixedPrecisionPolicy(bf16, fp32)``
(the same float32 shards; the bf16 copies exist only while gathered), and the step time of
``Zero3`` against ``fully_shard``'s on 2 ranks (float32, taking turns): one core per rank on a
2-core laptop, where 4 ranks would time the scheduler taking turns between them more than either.

    python -m ddp_tutorial.bench sharding [--world-sizes 1 2 4] [--layers 8] [--plot sharding.png]
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from ddp_tutorial.bench.common import Result
from ddp_tutorial.launch import spawn
from ddp_tutorial.models import TinyTransformer
from ddp_tutorial.sharding.fsdp import all_footprints
from ddp_tutorial.sharding.fsdp_practice import costs
from ddp_tutorial.sharding.memory import STRATEGIES, formula, table_rows

if TYPE_CHECKING:  # matplotlib is imported only when a plot is drawn
    from matplotlib.axes import Axes

HELP = "bytes per rank (params, grads, optimizer state) of DDP, ZeRO-1, ZeRO-2, FSDP2 at 1, 2, 4 ranks"
TARGETS = {"ZeRO-1 optimizer state / DDP's, 2 ranks": 0.6, "FSDP2 steady total / DDP's, 4 ranks": 0.3,
           "ZeRO-3 (ours) steady total / DDP's, 4 ranks": 0.3, "ZeRO-3 (ours) step time / fully_shard's, 2 ranks": 1.5}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--vocab", type=int, default=256)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--layers", type=int, default=8)


def run(args: argparse.Namespace) -> Result:
    model_kwargs = {"vocab": args.vocab, "dim": args.dim, "heads": args.heads, "layers": args.layers}
    num_params = sum(p.numel() for p in TinyTransformer(**model_kwargs).parameters())
    measured = {n: spawn(all_footprints, n, args=(model_kwargs,), timeout=300, quiet=True)
                for n in sorted(set(args.world_sizes) | {2, 4})}
    rows = table_rows(measured, num_params, STRATEGIES + ("ZeRO-1 (torch)",))
    # lesson 18: ZeRO-3 from scratch (Zero3) and FSDP2 with the bf16 policy; step times on 2 ranks
    ours = {n: spawn(costs, n, args=(model_kwargs, n == 2), timeout=300, quiet=True) for n in measured}
    rows += zero3_rows(ours, rows, num_params)
    for row in rows:
        if row["strategy"] == "FSDP2":
            row["peak"] = max(r["peak"] for r in measured[row["ranks"]])
            row["peak vs DDP"] = row["peak"] / next(r["total"] for r in rows
                                                    if r["ranks"] == row["ranks"] and r["strategy"] == "DDP")

    def pick(n: int, strategy: str) -> dict:
        return next(r for r in rows if r["ranks"] == n and r["strategy"] == strategy)

    seconds = ours[2][0]["seconds"]
    ratios = {"ZeRO-1 optimizer state / DDP's, 2 ranks": pick(2, "ZeRO-1")["optim"] / pick(2, "DDP")["optim"],
              "ZeRO-3 (ours) steady total / DDP's, 4 ranks": pick(4, "ZeRO-3 (ours)")["vs DDP"],
              "ZeRO-3 (ours) peak / DDP's, 4 ranks": pick(4, "ZeRO-3 (ours)")["peak vs DDP"],
              "FSDP2 bf16 policy steady total / DDP's, 4 ranks": pick(4, "FSDP2 bf16")["vs DDP"],
              "ZeRO-3 (ours) step time / fully_shard's, 2 ranks": seconds["ZeRO-3"] / seconds["FSDP2"],
              "FSDP2 steady total / DDP's, 4 ranks": pick(4, "FSDP2")["vs DDP"],
              "FSDP2 peak (+ root and one block gathered) / DDP's, 4 ranks": pick(4, "FSDP2")["peak vs DDP"]}
    met = all(ratios[k] <= t for k, t in TARGETS.items())
    rows = [r for r in rows if r["ranks"] in args.world_sizes]
    return Result(
        name=f"sharding: bytes per rank, TinyTransformer {model_kwargs} ({num_params:,} parameters, float32, Adam)",
        columns=["ranks", "strategy", "params", "grads", "optim", "total", "formula", "vs DDP", "peak", "peak vs DDP"],
        rows=rows,
        ratios=ratios,
        notes=["targets: " + "; ".join(f"{k} <= {t}" for k, t in TARGETS.items())
               + f": {'met' if met else 'NOT MET'}",
               "bytes of the rank holding the most; formula: 16 bytes per parameter, sharded as each strategy shards",
               "ZeRO-1 (torch) is ZeroRedundancyOptimizer: whole parameters per rank, so it can exceed the formula"],
    )


def zero3_rows(ours: dict[int, list[dict]], rows: list[dict], num_params: int) -> list[dict]:
    """Rows for ``Zero3`` (steady and peak) and FSDP2 under the bf16 policy, the rank holding the most."""
    out = []
    for n, ranks in ours.items():
        ddp = next(r["total"] for r in rows if r["ranks"] == n and r["strategy"] == "DDP")
        for name, key in (("ZeRO-3 (ours)", "ZeRO-3"), ("FSDP2 bf16", "FSDP2 bf16")):
            got = max((r[key] for r in ranks), key=lambda f: f.total)
            row = {"ranks": n, "strategy": name, **got.as_dict(), "formula": formula("FSDP2", num_params, n).total,
                   "vs DDP": got.total / ddp}
            if key == "ZeRO-3":
                row["peak"] = max(r["ZeRO-3 peak"] for r in ranks)
                row["peak vs DDP"] = row["peak"] / ddp
            out.append(row)
    return out


def plot(result: Result, ax: Axes) -> None:
    from ddp_tutorial.plots.sharding import plot_bytes_per_rank

    plot_bytes_per_rank([r for r in result.rows if r["strategy"] in STRATEGIES], ax)
