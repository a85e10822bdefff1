"""``bench experts``: expert parallelism's all-to-alls against its experts' compute (``21_expert_parallel``).

A mixture-of-experts layer (top-2, ``--dim`` wide experts of ``--hidden`` units) over
``--ranks`` ranks, each with ``--tokens`` tokens, for several numbers of experts per rank.
Forward only, timed in two parts on every rank, the best of ``--repeat``: dispatch + combine
(the counts' and the rows' all-to-alls, there and back) and the local experts' compute. Also
the rows each rank sends (mean and busiest) and, counted in one process for a random router,
the dropped fraction of the assignments against the capacity factor.
"""

from __future__ import annotations

import argparse
import time
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from ddp_tutorial.bench.common import Result
from ddp_tutorial.env import rank_device
from ddp_tutorial.expert_parallel.dispatch import ExpertParallelMoE, combine, dispatch
from ddp_tutorial.expert_parallel.routing import MoESetup, dropped_fraction, keep_mask, top_k_gates
from ddp_tutorial.launch import spawn
from ddp_tutorial.models import MixtureOfExperts

if TYPE_CHECKING:  # matplotlib is imported only when a plot is drawn
    from matplotlib.axes import Axes

HELP = "expert parallelism: dispatch + combine time vs the experts' compute, rows per rank, dropped vs capacity"
FACTORS = (0.5, 1.0, 1.25, 1.5, 2.0)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--experts-per-rank", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--tokens", type=int, default=512, help="tokens per rank")
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--repeat", type=int, default=5)


def layer_times(rank: int, world_size: int, experts_per_rank: list[int], tokens: int, dim: int, hidden: int,
                repeat: int) -> list[dict]:
    """For each number of experts per rank: the best seconds of dispatch + combine and of the experts."""
    device = rank_device()
    out = []
    for per_rank in experts_per_rank:
        torch.manual_seed(0)
        model = ExpertParallelMoE(MixtureOfExperts(dim, hidden, per_rank * world_size, 2).to(device))
        x = torch.randn(tokens, dim, generator=torch.Generator().manual_seed(rank)).to(device)
        best = {"a2a": float("inf"), "experts": float("inf")}
        with torch.no_grad():
            for _ in range(repeat + 1):  # the first round warms up
                dist.barrier()
                start = time.perf_counter()
                _, chosen, gates = top_k_gates(model.router(x), 2)
                keep = keep_mask(chosen, model.num_experts, None)
                rows, plan = dispatch(x, chosen, gates, keep, model.num_experts)
                sent = time.perf_counter()
                done = model.local_experts(rows, plan.received_counts)
                computed = time.perf_counter()
                combine(done, plan, tokens)
                back = time.perf_counter()
                best["a2a"] = min(best["a2a"], (sent - start) + (back - computed))
                best["experts"] = min(best["experts"], computed - sent)
        out.append({**best, "sent": sum(plan.send) - plan.send[rank]})  # rows that leave the rank
    return out


def run(args: argparse.Namespace) -> Result:
    per_rank = spawn(layer_times, args.ranks, args=(args.experts_per_rank, args.tokens, args.dim, args.hidden,
                                                    args.repeat), timeout=600, quiet=True)
    rows = []
    for i, experts in enumerate(args.experts_per_rank):
        a2a = max(r[i]["a2a"] for r in per_rank)  # the slowest rank sets the pace
        compute = max(r[i]["experts"] for r in per_rank)
        sent = [r[i]["sent"] for r in per_rank]
        rows.append({"experts_per_rank": experts, "experts": experts * args.ranks, "a2a_ms": a2a * 1e3,
                     "experts_ms": compute * 1e3, "a2a_over_compute": a2a / compute,
                     "rows_out_mean": sum(sent) / len(sent), "rows_out_max": max(sent)})
    dropped = dropped_fraction(MoESetup(tokens_per_rank=args.tokens, num_experts=8), args.ranks, list(FACTORS))
    ratios = {f"a2a / experts, {r['experts_per_rank']} expert(s) per rank": r["a2a_over_compute"] for r in rows}
    ratios.update({f"dropped at capacity factor {f:g}": d for f, d in zip(FACTORS, dropped)})
    return Result(
        name=(f"experts: {args.ranks} ranks x {args.tokens} tokens, top-2, dim {args.dim}, hidden {args.hidden} "
              f"(forward, best of {args.repeat})"),
        columns=["experts_per_rank", "experts", "a2a_ms", "experts_ms", "a2a_over_compute", "rows_out_mean",
                 "rows_out_max"],
        rows=rows, ratios=ratios,
        notes=["a2a: the counts and the rows out, the results back; rows_out: rows a rank sends to other ranks",
               "dropped: 8 experts, a random router, each rank's tokens one capacity group"],
    )


def plot(result: Result, ax: Axes) -> None:
    experts = [r["experts_per_rank"] for r in result.rows]
    ax.plot(experts, [r["a2a_ms"] for r in result.rows], "o-", label="dispatch + combine")
    ax.plot(experts, [r["experts_ms"] for r in result.rows], "s-", label="experts' compute")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("experts per rank")
    ax.set_ylabel("ms per forward (slowest rank)")
    ax.set_title("expert parallelism: communication vs compute")
    ax.legend()
