"""``bench roofline``: this machine's roofline, and the course's operations placed on it (issue 39, "How fast, and why").

From one run: the achievable matmul rate (best of several matmul shapes and repeats: the square ones of
``roofline.peak_matmul_rate`` and the linears below), the copy bandwidth, their ridge point; then a linear layer at growing
batch, attention (``scaled_dot_product_attention``) and a layer norm, each with its arithmetic intensity
(FLOPs over the fewest bytes it must move), its measured rate and the roofline's attainable one; and an
all-reduce on 2 gloo ranks, which does no arithmetic worth counting: its bytes/s against the copy's.
Every figure is this machine's, printed, never asserted.

    python -m ddp_tutorial.bench roofline [--repeat 5] [--json PATH]
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from ddp_tutorial.bench.collective_bw import allreduce_seconds
from ddp_tutorial.bench.common import Result
from ddp_tutorial.launch import spawn
from ddp_tutorial.performance import roofline
from ddp_tutorial.performance.roofline import Roofline, attainable, linear_intensity, norm_intensity
from ddp_tutorial.timing import timed

HELP = "this machine's roofline: matmul FLOP/s, copy bandwidth, ridge; linear, attention, norm, all-reduce on it"
DIM = 512
BATCHES = (1, 16, 256, 2048)
ALLREDUCE_BYTES = 1 << 22


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repeat", type=int, default=5, help="timed runs of each operation (the best counts)")


def operations() -> list[tuple[str, str, float, float, object]]:
    """(operation, shape, FLOPs, fewest bytes moved, a call running it once), float32."""
    ops = []
    for b in BATCHES:
        x, w = torch.randn(b, DIM), torch.randn(DIM, DIM)
        flops = 2 * b * DIM * DIM
        ops.append(("linear", f"{b}x{DIM} @ {DIM}x{DIM}", flops,
                    flops / linear_intensity(batch=b, d_in=DIM, d_out=DIM, dtype_bytes=4),
                    lambda x=x, w=w: F.linear(x, w)))
    b, h, s, d = 1, 4, 512, 64
    q, k, v = (torch.randn(b, h, s, d) for _ in range(3))
    # Q K^T and P V: 4 s^2 d per head; at best q, k, v read and the output written once (flash attention)
    ops.append(("attention", f"{b}x{h}x{s}x{d}", 4 * b * h * s * s * d, 4 * b * h * s * d * 4,
                lambda: F.scaled_dot_product_attention(q, k, v)))
    rows, dim = 4096, DIM
    t = torch.randn(rows, dim)
    ops.append(("layer norm", f"{rows}x{dim}", 8 * rows * dim,
                8 * rows * dim / norm_intensity(rows=rows, dim=dim, dtype_bytes=4),
                lambda: F.layer_norm(t, (dim,))))
    return ops


def allreduce_rate(rank: int, world_size: int, nbytes: int, repeat: int) -> float:
    """Worker: the best algbw (bytes/s) of an all-reduce of ``nbytes``, the slowest rank's
    (``collective_bw.allreduce_seconds``: the best of ``repeat`` single calls)."""
    return nbytes / allreduce_seconds(nbytes, calls=1, repeat=repeat)


def run(args: argparse.Namespace) -> Result:
    timed_ops = [(name, shape, flops, moved, timed(call, repeat=args.repeat))
                 for name, shape, flops, moved, call in operations()]
    # the achievable peak is the best matmul of any shape tried (as MAMF tables take it): the square ones
    # of ``roofline.peak_matmul_rate`` and the linears here, which are matmuls too
    linears = [flops / seconds for name, _, flops, _, seconds in timed_ops if name == "linear"]
    roof = Roofline(peak=max([roofline.peak_matmul_rate(repeat=args.repeat), *linears]),
                    bandwidth=roofline.copy_bandwidth(repeat=args.repeat))
    rows = []
    for name, shape, flops, moved, seconds in timed_ops:
        intensity = flops / moved
        rate, roof_rate = flops / seconds, attainable(roof, intensity)
        rows.append({"operation": name, "shape": shape, "FLOPs/byte": round(intensity, 2),
                     "bound": "compute" if intensity >= roof.ridge else "memory",
                     "measured GFLOP/s": rate / 1e9, "attainable GFLOP/s": roof_rate / 1e9,
                     "measured GB/s": moved / seconds / 1e9, "measured/attainable": round(rate / roof_rate, 2)})
    algbw = spawn(allreduce_rate, 2, args=(ALLREDUCE_BYTES, args.repeat), backend="gloo", threads=1,
                  timeout=120, quiet=True)[0]
    rows.append({"operation": "all-reduce", "shape": f"{ALLREDUCE_BYTES >> 20} MiB, 2 gloo ranks",
                 "FLOPs/byte": "-", "bound": "link", "measured GFLOP/s": "-", "attainable GFLOP/s": "-",
                 "measured GB/s": algbw / 1e9, "measured/attainable": round(algbw / roof.bandwidth, 2)})
    return Result(
        name=f"roofline: this machine, {torch.get_num_threads()} torch threads, float32 (best of {args.repeat})",
        columns=["operation", "shape", "FLOPs/byte", "bound", "measured GFLOP/s", "attainable GFLOP/s",
                 "measured GB/s", "measured/attainable"],
        rows=rows,
        ratios={"achievable matmul GFLOP/s": roof.peak / 1e9, "copy GB/s": roof.bandwidth / 1e9,
                "ridge FLOPs/byte": roof.ridge},
        notes=["attainable = min(peak, intensity x bandwidth); bytes are the fewest each operation must move",
               "the roof's bandwidth is a 64 MiB copy (main memory): operands that fit in a cache can beat it",
               "all-reduce: algbw (buffer bytes / time) against the copy bandwidth, not FLOP/s",
               f"ridge point {roof.ridge:.3g} FLOPs/byte: operations left of it wait for memory"],
    )
