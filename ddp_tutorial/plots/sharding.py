"""Bytes per rank of each sharding strategy, measured next to the textbook formulas (``14_sharding``).

Drawn from the rows of ``memory.table_rows`` (what the ranks' real tensors held); also used
by ``python -m ddp_tutorial.bench sharding --plot``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # matplotlib is imported when a plot is drawn, not with the package
    from matplotlib.axes import Axes

PARTS = (("params", "parameters", "C0"), ("grads", "gradients", "C1"), ("optim", "optimizer state", "C2"))


def plot_bytes_per_rank(rows: Sequence[dict], ax: Axes, unit: float = 1024.0, unit_name: str = "KiB",
                        title: str = "Bytes per rank: measured (bars), formula (black line)") -> Axes:
    """Stacked bars (parameters, gradients, optimizer state) for each world size and strategy,
    with the formula's total as a black line across each bar."""
    sizes = sorted({r["ranks"] for r in rows})
    strategies = list(dict.fromkeys(r["strategy"] for r in rows))
    width = 0.8 / len(strategies)
    ticks, labels = [], []
    for g, n in enumerate(sizes):
        for s, strategy in enumerate(strategies):
            row = next(r for r in rows if r["ranks"] == n and r["strategy"] == strategy)
            x = g + (s - (len(strategies) - 1) / 2) * width
            bottom = 0.0
            for key, label, colour in PARTS:
                ax.bar(x, row[key] / unit, width * 0.9, bottom=bottom, color=colour,
                       label=label if (g, s) == (0, 0) else None)
                bottom += row[key] / unit
            ax.plot([x - width * 0.45, x + width * 0.45], [row["formula"] / unit] * 2, color="black",
                    linewidth=2, label="formula" if (g, s) == (0, 0) else None)
            ticks.append(x)
            labels.append(strategy)
    ax.set_xticks(ticks)
    ax.set_xticklabels(labels, fontsize=8, rotation=90)
    for g, n in enumerate(sizes):  # the world size, under its group of bars
        ax.text(g, -0.32, f"{n} rank{'s' if n > 1 else ''}", transform=ax.get_xaxis_transform(),
                ha="center", va="top", fontsize=10, fontweight="bold")
    ax.set_ylim(0, 1.3 * max(max(r["total"], r["formula"]) for r in rows) / unit)  # room for the legend
    ax.set_ylabel(f"{unit_name} per rank")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, ncol=2, loc="upper right")
    return ax
