"""Who computes how much under causal ring attention: the contiguous and zig-zag layouts (lesson 20)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import matplotlib.pyplot as plt
from matplotlib.axes import Axes


def plot_work_per_rank(work: Mapping[str, Sequence[int]], ax: Axes | None = None) -> Axes:
    """Grouped bars: per rank, the scores each layout makes it compute (``zigzag.scores_per_rank``)."""
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 3.2))
    layouts = list(work)
    ranks = range(len(next(iter(work.values()))))
    width = 0.8 / len(layouts)
    for i, layout in enumerate(layouts):
        ax.bar([r + (i - (len(layouts) - 1) / 2) * width for r in ranks], work[layout], width, label=layout)
    ax.set_xticks(list(ranks), [f"rank {r}" for r in ranks])
    ax.set_ylabel("attention scores computed")
    ax.set_title("causal ring attention: work per rank")
    ax.legend()
    return ax
