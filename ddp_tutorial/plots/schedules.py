"""Pipeline schedules drawn from their timelines: a lane per rank, a box per action (``19_pipeline_schedules``).

Events are ``(rank, stage, kind, micro, start, end)`` as ``pipeline_parallel.orders`` and the
workers of ``one_f_one_b`` and ``torch_schedules`` record them: F, B and W in three shades of a
colour per micro-batch, the micro-batch's number in the box, white space where a rank waited.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # matplotlib is imported when a plot is drawn, not with the package
    from matplotlib.axes import Axes

SHADE = {"F": 1.0, "B": 0.6, "W": 0.3}  # forward solid, backward lighter, weight gradient lightest


def plot_schedule(events: Sequence[tuple], ax: Axes | None = None, title: str = "", unit: str = "ms",
                  xmax: float | None = None) -> Axes:
    """Gantt chart of one run: a lane per rank; ``unit`` ``"ms"`` for recorded seconds, ``"steps"``
    for a simulated clock. A stage other than the rank's number is named in the box (``3:F0``)."""
    import matplotlib.pyplot as plt

    scale = 1e3 if unit == "ms" else 1.0
    ranks = sorted({e[0] for e in events})
    if ax is None:
        _, ax = plt.subplots(figsize=(9, 0.7 + 0.55 * len(ranks)))
    start0 = min(e[4] for e in events)
    span = (xmax or max(e[5] for e in events) - start0) * scale
    many_stages = any(e[1] != e[0] for e in events)
    for rank, stage, kind, micro, start, end in events:
        x, width = (start - start0) * scale, (end - start) * scale
        ax.broken_barh([(x, width)], (rank - 0.38, 0.76), facecolors=f"C{micro % 10}", alpha=SHADE[kind],
                       edgecolor="black", linewidth=0.4)
        label = f"{stage}:{kind}{micro}" if many_stages else f"{kind}{micro}"
        if width > 0.012 * len(label) * span:  # a label only where it fits
            ax.text(x + width / 2, rank, label, ha="center", va="center", fontsize=6)
    ax.set_yticks(ranks)
    ax.set_yticklabels([f"rank {r}" for r in ranks], fontsize=8)
    ax.set_ylim(max(ranks) + 0.5, min(ranks) - 0.5)
    ax.set_xlim(0, span * 1.01)
    ax.set_xlabel("time (ms)" if unit == "ms" else "time (a forward = 1)", fontsize=8)
    ax.set_title(title, fontsize=9)
    return ax
