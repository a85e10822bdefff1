"""``bench memory``: the memory calculator's bytes per term against bytes measured from real tensors (``17_memory``).

For a ``TinyGPT`` (``TinyTransformer`` with dropout; default: 4 blocks, width 64, 128 tokens per sequence) it measures
the activations forward leaves alive for backward (``recompute.held_after_forward``) for each
``recompute.MODES`` (none, selective, keep-matmuls, full) with op-by-op attention, and without
checkpointing with ``scaled_dot_product_attention``, and the parameters, gradients and Adam
state of DDP, ZeRO-1, ZeRO-2 and FSDP2 on 2 ranks; each next to ``calculator.bytes_per_rank``'s
prediction. Where the calculator says it is exact the ratio must be 1 (the target: 0.9-1.1).
Then the step's FLOPs and time with checkpointing, as ratios to no checkpointing in the same run.
Everything runs on this process's device (``env.choose_device``: the GPU when there is one);
on CUDA the dropout masks are 1-byte (``mask_bytes=1``), and allocator effects do not enter
(the bytes are the tensors'), but a fused attention kernel may keep a padded log-sum-exp.

    python -m ddp_tutorial.bench memory [--layers 4] [--dim 64] [--seq 128] [--plot memory.png]
"""

from __future__ import annotations

import argparse
import warnings
from typing import TYPE_CHECKING

import torch

from ddp_tutorial.bench.common import Result
from ddp_tutorial.env import choose_device
from ddp_tutorial.launch import spawn
from ddp_tutorial.models import TinyGPT, token_batch
from ddp_tutorial.sharding.calculator import ModelShape, bytes_per_rank
from ddp_tutorial.sharding.fsdp import all_footprints
from ddp_tutorial.sharding.recompute import MODES, held_after_forward, recompute_blocks, tradeoff

if TYPE_CHECKING:  # matplotlib is imported only when a plot is drawn
    from matplotlib.axes import Axes

HELP = "predicted vs measured bytes per term (activations, checkpointing, ZeRO 0-3) and recompute's cost"
TARGET = (0.9, 1.1)
STATES = {"DDP": 0, "ZeRO-1": 1, "ZeRO-2": 2, "FSDP2": 3}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--vocab", type=int, default=256)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--batch", type=int, default=4)


def device() -> torch.device:
    """This process's device: the first GPU when there is one, else the CPU."""
    return choose_device(0, "nccl" if torch.cuda.is_available() else "gloo")


def activation_rows(args: argparse.Namespace) -> list[dict]:
    shape = ModelShape.course(vocab=args.vocab, dim=args.dim, heads=args.heads, layers=args.layers, seq=args.seq)
    where = device()
    tokens, targets = token_batch(0, 1, per_rank=args.batch, seq=args.seq, vocab=args.vocab, device=where)
    rows = []
    for attention, recompute in [("math", mode) for mode in MODES] + [("sdpa", "none")]:
        torch.manual_seed(0)
        # dropout 0.1 op by op; the fused kernel without dropout (with it, CPU falls back to the math path)
        dropout = 0.1 if attention == "math" else 0.0
        model = TinyGPT(args.vocab, args.dim, args.heads, args.layers, dropout=dropout, attention=attention).to(where)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            measured = held_after_forward(recompute_blocks(model, recompute), tokens, targets=targets)
        predicted = bytes_per_rank(shape, micro_batch=args.batch, precision="fp32", recompute=recompute,
                                   dropout=dropout > 0, attention="math" if attention == "math" else "flash",
                                   mask_bytes=1 if where.type == "cuda" else None)  # CUDA's dropout: a bool mask
        rows.append({"configuration": f"1 rank, attention {attention}, recompute {recompute}", "term": "activations",
                     "predicted": predicted["activations"], "measured": measured})
    return rows


def state_rows(args: argparse.Namespace) -> list[dict]:
    kwargs = {"vocab": args.vocab, "dim": args.dim, "heads": args.heads, "layers": args.layers}
    ranks = spawn(all_footprints, 2, args=(kwargs,), timeout=300, quiet=True)
    shape = ModelShape.course(vocab=args.vocab, dim=args.dim, heads=args.heads, layers=args.layers, seq=args.seq)
    rows = []
    for strategy, zero in STATES.items():
        predicted = bytes_per_rank(shape, dp=2, zero=zero, precision="fp32")
        for term, attr in (("parameters", "params"), ("gradients", "grads"), ("optimizer states", "optim")):
            rows.append({"configuration": f"2 ranks, {strategy} (ZeRO-{zero})", "term": term,
                         "predicted": predicted[term], "measured": max(getattr(r[strategy], attr) for r in ranks)})
    return rows


def run(args: argparse.Namespace) -> Result:
    rows = activation_rows(args) + state_rows(args)
    for row in rows:
        row["ratio"] = row["measured"] / row["predicted"]
    costs = tradeoff({"vocab": args.vocab, "dim": args.dim, "heads": args.heads, "layers": args.layers,
                      "dropout": 0.1, "attention": "math"}, batch=args.batch, seq=args.seq, device=device())
    ratios = {"worst measured / predicted": max((r["ratio"] for r in rows), key=lambda x: abs(x - 1))}
    for c in costs[1:]:
        ratios[f"{c['mode']} checkpointing: activation bytes / none's"] = c["held ratio"]
        ratios[f"{c['mode']} checkpointing: FLOPs / none's"] = c["flops ratio"]
        ratios[f"{c['mode']} checkpointing: step time / none's"] = c["time ratio"]
    met = all(TARGET[0] <= r["ratio"] <= TARGET[1] for r in rows)
    return Result(
        name=f"memory: predicted vs measured bytes, TinyGPT(vocab {args.vocab}, dim {args.dim}, heads "
             f"{args.heads}, layers {args.layers}), batch {args.batch} x seq {args.seq}, float32, Adam, "
             f"activations on {device().type}",
        columns=["configuration", "term", "predicted", "measured", "ratio"],
        rows=rows, ratios=ratios,
        notes=[f"target: every ratio in {TARGET[0]}-{TARGET[1]} (the calculator is exact here): "
               f"{'met' if met else 'NOT MET'}",
               "activations: bytes alive after forward (with the loss), dropout 0.1 (math), 0 (sdpa); states: the rank holding most",
               "step time ratios of a tiny model: framework overhead (and on a CPU, the keep-matmuls policy's Python "
               "dispatch mode) weighs more than at scale on a GPU"],
        )


def plot(result: Result, ax: Axes) -> None:
    from ddp_tutorial.plots.saved_bytes import plot_recompute_tradeoff

    none = result.rows[0]["measured"]
    rows = [{"mode": "none", "held ratio": 1.0, "flops ratio": 1.0, "time ratio": 1.0}]
    for mode, row in zip(MODES[1:], result.rows[1:len(MODES)]):
        rows.append({"mode": mode, "held ratio": row["measured"] / none,
                     "flops ratio": result.ratios[f"{mode} checkpointing: FLOPs / none's"],
                     "time ratio": result.ratios[f"{mode} checkpointing: step time / none's"]})
    plot_recompute_tradeoff(rows, ax)
