"""Where a rank's bytes go (``17_memory``): saved bytes by op next to the formula, and recomputation's trade-off.

Drawn from what ``sharding.activations`` and ``sharding.recompute`` measured; the trade-off
is also ``python -m ddp_tutorial.bench memory --plot``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # matplotlib is imported when a plot is drawn, not with the package
    from matplotlib.axes import Axes


def plot_saved_by_op(measured: dict[str, int], formula: dict[str, int], ax: Axes, title: str = "") -> Axes:
    """Horizontal bars: bytes each op saved (measured), with the formula's term as a black tick."""
    names = list(formula)
    ys = range(len(names))
    ax.barh(list(ys), [measured.get(n, 0) / 1024 for n in names], color="C0", label="measured")
    ax.scatter([formula[n] / 1024 for n in names], list(ys), marker="|", s=300, color="black", label="formula")
    ax.set_yticks(list(ys))
    ax.set_yticklabels(names, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("KiB saved for backward, one block")
    ax.set_title(title or "Saved bytes by op: measured vs formula")
    ax.legend(fontsize=8, loc="lower right")
    return ax


def plot_recompute_tradeoff(rows: Sequence[dict], ax: Axes, title: str = "") -> Axes:
    """Each checkpointing mode as a point: bytes held after forward vs the step's cost, both as ratios to none."""
    for row, colour in zip(rows, ("C0", "C1", "C2", "C3")):
        ax.scatter(row["held ratio"], row["flops ratio"], color=colour, s=60, label=f"{row['mode']}: FLOPs")
        if "time ratio" in row:
            ax.scatter(row["held ratio"], row["time ratio"], color=colour, marker="x", s=60,
                       label=f"{row['mode']}: time")
    ax.set_xlabel("activation bytes held after forward (x no checkpointing)")
    ax.set_ylabel("cost of a step (x no checkpointing)")
    ax.set_xlim(0, 1.1)
    ax.axhline(1.0, color="grey", linewidth=0.5)
    ax.set_title(title or "Activation checkpointing: memory against compute")
    ax.legend(fontsize=7)
    return ax
