"""``bench allreduce``: bus bandwidth of ``ring_all_reduce`` against ``dist.all_reduce``, over sizes.

The measurement is lesson 06's (``ddp_tutorial.comm.busbw``: algbw, busbw and a one-thread
memory copy as nccl-tests define them); this runs it over more sizes and repetitions,
and reports the ratios at 16 MB (``HEADLINE``) on 2 and 4 ranks.

    python -m ddp_tutorial.bench allreduce --plot allreduce.png
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from ddp_tutorial.bench.common import Result
from ddp_tutorial.comm.busbw import HEADLINE, KB, MB, memcpy_bandwidth, sweep
from ddp_tutorial.comm.ring import PIECE_BYTES

if TYPE_CHECKING:  # matplotlib is imported only when a plot is drawn
    from matplotlib.axes import Axes

HELP = "bus bandwidth of ring_all_reduce vs dist.all_reduce, 4 KB..64 MB, 2 and 4 ranks"
DEFAULT_SIZES = [4 * KB * 4 ** i for i in range(8)]  # 4 KB ... 64 MB


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--sizes", type=int, nargs="+", default=DEFAULT_SIZES, metavar="BYTES")
    parser.add_argument("--repeat", type=int, default=9,
                        help="timings per point, the best is kept (5x as many at 16 MB, the headline)")
    parser.add_argument("--piece-bytes", type=int, default=PIECE_BYTES, help="ring pipelining piece")


def _size_label(nbytes: int) -> str:
    return f"{nbytes // MB} MB" if nbytes >= MB else f"{nbytes // KB} KB"


def run(args: argparse.Namespace) -> Result:
    copy_gbps = memcpy_bandwidth() / 1e9
    rows, ratios = [], {}
    for n in args.world_sizes:
        for row in sweep(n, args.sizes, args.repeat, args.piece_bytes):
            row["size"] = _size_label(row["bytes"])
            rows.append(row)
            if row["bytes"] == HEADLINE:
                ratios[f"ring/dist busbw at 16 MB, {n} ranks"] = row["ring/dist"]
                ratios[f"memcpy / dist busbw at 16 MB, {n} ranks"] = copy_gbps / row["dist_busbw"]
    return Result(
        name=(f"allreduce: float32 SUM on gloo, busbw in GB/s "
              f"(best of {args.repeat}, of {5 * args.repeat} at 16 MB)"),
        columns=["world_size", "size", "ring_s", "dist_s", "ring_busbw", "dist_busbw", "ring/dist"],
        rows=rows, ratios=ratios,
        notes=[f"memcpy (1 thread, 64 MB): {copy_gbps:.3g} GB/s",
               "busbw = bytes / time * 2(n-1)/n; target: ring/dist >= 0.8 at 16 MB on 2 and 4 ranks"],
    )


def plot(result: Result, ax: Axes) -> None:
    from ddp_tutorial.plots import plot_busbw

    copy = [float(note.split(": ")[1].split()[0]) for note in result.notes if note.startswith("memcpy")]
    plot_busbw(result.rows, ax, memcpy_gbps=copy[0] if copy else None)

