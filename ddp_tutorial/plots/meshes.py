"""Which rank holds which block of a tensor: DTensor placements and tensor-parallel weights.

Used by ``15_tensor_parallel``, drawn from the shapes and offsets the workers returned
(``device_mesh``: each block's ``shape``, ``offset``, ``global_shape`` and ``placements``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # matplotlib is imported when a plot is drawn, not with the package
    from matplotlib.axes import Axes


def _as_2d(shape: Sequence[int], offset: Sequence[int]) -> tuple[tuple[int, int], tuple[int, int]]:
    """A 1-D block (a bias) drawn as one row."""
    if len(shape) == 1:
        return (1, shape[0]), (0, offset[0])
    return (shape[0], shape[1]), (offset[0], offset[1])


def plot_tensor_blocks(blocks: Sequence[dict], names: Sequence[str], axes: Sequence[Axes] | None = None,
                       label: str = "", xlabel: str = "dim 1 (columns)", ylabel: str = "dim 0 (rows)",
                       describe: dict | None = None) -> Sequence[Axes]:
    """One panel per tensor ``name``: its global shape cut into the blocks the ranks hold.

    ``blocks[rank][name]`` is what rank ``rank`` returned for that tensor: ``shape``, ``offset``
    (of its first element in the whole tensor), ``global_shape`` and ``placements``. Ranks that
    hold the same block (replicas) share one rectangle, labelled with all of them; an empty
    block is listed under the panel. ``describe[name]`` adds words to a panel's title
    (e.g. "column-parallel"); ``label`` starts every title.
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    if axes is None:
        _, axes = plt.subplots(1, len(names), figsize=(3.6 * len(names), 3.2), squeeze=False)
        axes = list(axes[0])
    for ax, name in zip(axes, names):
        holders: dict[tuple, list[int]] = {}
        for rank, mine in enumerate(blocks):
            block = mine[name]
            holders.setdefault((tuple(block["offset"]), tuple(block["shape"])), []).append(rank)
        first = blocks[0][name]
        (rows, cols), _ = _as_2d(first["global_shape"], [0] * len(first["global_shape"]))
        empty = []
        for colour, ((offset, shape), ranks) in enumerate(sorted(holders.items())):
            (h, w), (r0, c0) = _as_2d(shape, offset)
            who = f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))
            if h == 0 or w == 0:
                empty.append(who)
                continue
            ax.add_patch(Rectangle((c0, r0), w, h, facecolor=f"C{colour % 10}", alpha=0.55,
                                   edgecolor="black", linewidth=1.5))
            ax.text(c0 + w / 2, r0 + h / 2, f"{who}\n{h} x {w}", ha="center", va="center", fontsize=9)
        for r in range(rows + 1):  # a faint grid: one cell per element
            ax.plot([0, cols], [r, r], color="gray", linewidth=0.3)
        for c in range(cols + 1):
            ax.plot([c, c], [0, rows], color="gray", linewidth=0.3)
        ax.set_xlim(-0.2, cols + 0.2)
        ax.set_ylim(rows + 0.2, -0.2)  # row 0 at the top, as a matrix is printed
        ax.set_aspect("equal")
        ax.set_xticks([c + 0.5 for c in range(cols)])
        ax.set_xticklabels([str(c) for c in range(cols)], fontsize=7)
        ax.set_yticks([r + 0.5 for r in range(rows)])
        ax.set_yticklabels([str(r) for r in range(rows)] if len(first["global_shape"]) > 1 else [""], fontsize=7)
        ax.tick_params(length=0)
        ax.set_xlabel(xlabel + (f"\nempty block: {', '.join(empty)}" if empty else ""), fontsize=9)
        ax.set_ylabel(ylabel, fontsize=9)
        shape = " x ".join(map(str, first["global_shape"]))
        placements = ", ".join(first["placements"])
        extra = f", {describe[name]}" if describe and name in describe else ""
        ax.set_title(f"{label}{name} ({shape})\n[{placements}]{extra}", fontsize=10)
        for side in ("top", "right", "bottom", "left"):
            ax.spines[side].set_visible(False)
    return axes


def plot_rank_grid(coords: Sequence[dict], sizes: dict, ax: Axes | None = None, title: str = "") -> Axes:
    """Each rank at its mesh coordinates (``22_capstone``): ``pp`` stages as panels side by side,
    ``dp`` replicas as rows, ``tp`` as columns, each cell labelled with its rank and coordinates.

    ``coords[rank]`` is what that rank reported (``{"pp": 0, "dp": 1, "cp": 0, "tp": 1}``);
    ``sizes`` the layout's size of each dimension.
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    pp, dp, tp = sizes.get("pp", 1), sizes.get("dp", 1), sizes.get("tp", 1)
    if ax is None:
        _, ax = plt.subplots(figsize=(2.2 * pp * tp + 1, 1.4 * dp + 1.2))
    colours = plt.get_cmap("tab10")
    for rank, c in enumerate(coords):
        x, y = c["pp"] * (tp + 0.5) + c["tp"], dp - 1 - c["dp"]
        ax.add_patch(Rectangle((x, y), 0.9, 0.85, facecolor=colours(c["pp"]), alpha=0.35, edgecolor="black"))
        ax.text(x + 0.45, y + 0.5, f"rank {rank}", ha="center", va="center", fontsize=10, weight="bold")
        ax.text(x + 0.45, y + 0.22, f"pp{c['pp']} dp{c['dp']} tp{c['tp']}", ha="center", va="center", fontsize=8)
    for stage in range(pp):
        ax.text(stage * (tp + 0.5) + tp / 2 - 0.05, dp + 0.1, f"stage {stage} (pp={stage})", ha="center", fontsize=9)
    ax.set_xlim(-0.2, pp * (tp + 0.5) - 0.3)
    ax.set_ylim(-0.2, dp + 0.45)
    ax.set_xlabel("tp: across a row (the same layer's shards)")
    ax.set_ylabel("dp: down (replicas)")
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_title(title or "each rank's coordinates on the mesh")
    return ax
