"""Pictures of communication: collectives, the ring, bandwidth, subgroups and tokens.

Used by ``02_process_groups`` to ``06_ring_all_reduce`` and ``08_ddp_from_scratch``
(the all-reduce cost fit), always drawn from values the workers really returned.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # matplotlib is imported when a plot is drawn, not with the package
    from matplotlib.axes import Axes


# ---------------------------------------------------------------- 05 collectives, 06 ring

_CELL_INCHES = 0.55  # one element of a rank's tensor
_NOTE_CELLS = 3  # cells "(nothing to read)" or a panel's title spans


def _grid(ax, holdings, title: str, vmin: float, vmax: float, cmap: str = "viridis",
          width: int | None = None, changed=None, labels=None, fontsize: int = 9) -> None:
    """One row per rank, one cell per element, coloured by value and labelled with it (or ``labels``)."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    cm = plt.get_cmap(cmap)
    width = width or max([len(h or []) for h in holdings] + [1])
    span = (vmax - vmin) or 1.0
    for r, values in enumerate(holdings):
        for j, v in enumerate(values or []):
            face = cm(0.15 + 0.7 * (float(v) - vmin) / span)
            ax.add_patch(Rectangle((j, r), 1, 1, facecolor=face,
                                   edgecolor="black", linewidth=2.5 if changed and changed[r][j] else 0.5))
            text = labels[r][j] if labels else (f"{v:g}" if isinstance(v, float) else str(v))
            dark = 0.299 * face[0] + 0.587 * face[1] + 0.114 * face[2] < 0.5  # perceived brightness
            ax.text(j + 0.5, r + 0.5, text, ha="center", va="center", fontsize=fontsize,
                    color="white" if dark else "black")
        if not values:
            note = "(nothing to read)" if values is None else "(empty)"
            ax.text(0.1, r + 0.5, note, va="center", fontsize=fontsize, color="dimgray", style="italic")
    ax.set_xlim(0, width)
    ax.set_ylim(len(holdings), 0)
    ax.set_yticks([r + 0.5 for r in range(len(holdings))])
    ax.set_yticklabels([f"rank {r}" for r in range(len(holdings))])
    ax.set_xticks([])
    ax.set_title(title, fontsize=10)
    for side in ("top", "right", "bottom", "left"):
        ax.spines[side].set_visible(False)


def plot_collective(name: str, before: list, after: list,
                    axes: Sequence[Axes] | None = None) -> Sequence[Axes]:
    """Two panels: what every rank holds before and after a collective (lists per rank; ``None`` = nothing).

    Each panel is as wide as what it holds (room for a note at least), both labelled by rank.
    """
    import matplotlib.pyplot as plt

    flat = [float(v) for h in before + after for v in (h or [])]
    vmin, vmax = (min(flat), max(flat)) if flat else (0.0, 1.0)
    # in cells: the longest row, or the width the title or "(nothing to read)" needs
    widths = [max([len(h or []) for h in holdings] + [_NOTE_CELLS]) for holdings in (before, after)]
    if axes is None:
        _, axes = plt.subplots(1, 2, figsize=(1.4 + _CELL_INCHES * sum(widths), 0.55 + 0.45 * len(before)),
                               width_ratios=widths, layout="constrained")
    _grid(axes[0], before, f"{name}: before", vmin, vmax, width=widths[0])
    _grid(axes[1], after, f"{name}: after", vmin, vmax, width=widths[1])
    return axes


def plot_ring_steps(states: list, axes: Sequence[Axes] | None = None) -> Sequence[Axes]:
    """The ring all-reduce step by step from ``ring.ring_trace``: ``states[rank][step]`` per rank.

    Cells are coloured by how many ranks' values they contain (the digits that are 1),
    and framed when they changed in that step. Without ``axes`` (one per step) the
    reduce-scatter steps fill the top row and the all-gather steps the row below.
    """
    import matplotlib.pyplot as plt

    world_size = len(states)
    first_in_row = {0}
    if axes is None:
        fig, grid = plt.subplots(2, world_size, squeeze=False,
                                 figsize=(world_size * (0.55 * world_size + 0.45) + 0.7, 2 * (0.5 * world_size + 0.8)))
        axes = list(grid[0]) + list(grid[1][1:])
        first_in_row = {0, world_size}
        key = grid[1][0]
        key.axis("off")
        key.text(0, 0.5, "each digit: is that rank's\nvalue in the sum?\n\ncolour: how many ranks\n"
                 "the sum holds\n\nthick frame: changed\nin this step", va="center", fontsize=9)
        fig.suptitle(f"Ring all-reduce on {world_size} ranks: rank r starts with 10**r", fontsize=11)
    for t, ax in enumerate(axes):
        held = [[int(v) for v in states[r][t]] for r in range(world_size)]
        counts = [[str(v).count("1") for v in row] for row in held]
        changed = None if t == 0 else [[a != b for a, b in zip(states[r][t], states[r][t - 1])]
                                       for r in range(world_size)]
        if t == 0:
            title = "start"
        elif t < world_size:
            title = f"reduce-scatter {t}"
        else:
            title = f"all-gather {t - world_size + 1}"
        labels = [[f"{v:0{world_size}d}" for v in row] for row in held]
        _grid(ax, counts, title, 1, world_size, cmap="YlGnBu", changed=changed, labels=labels, fontsize=10)
        ax.set_xticks([j + 0.5 for j in range(world_size)])
        ax.set_xticklabels([f"seg {j}" for j in range(world_size)], fontsize=9)
        ax.tick_params(axis="x", length=0)
        if t not in first_in_row:
            ax.set_yticklabels([])
    if len(first_in_row) > 1:
        axes[0].figure.tight_layout()
    return axes


def plot_busbw(rows: list, ax: Axes, memcpy_gbps: float | None = None) -> Axes:
    """Bus bandwidth over message size from ``busbw.sweep`` rows, one line per (impl, world_size)."""
    for i, n in enumerate(sorted({row["world_size"] for row in rows})):
        mine = sorted((r for r in rows if r["world_size"] == n), key=lambda r: r["bytes"])
        sizes = [r["bytes"] for r in mine]
        ax.plot(sizes, [r["ring_busbw"] for r in mine], "o-", color=f"C{i}", label=f"ring_all_reduce, {n} ranks")
        ax.plot(sizes, [r["dist_busbw"] for r in mine], "s--", color=f"C{i}", alpha=0.6,
                label=f"dist.all_reduce, {n} ranks")
    if memcpy_gbps:
        ax.axhline(memcpy_gbps, color="gray", linestyle=":", label="memory copy (1 thread)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.set_title("all-reduce bus bandwidth (gloo, loopback)")
    ax.legend(fontsize=8)
    return ax


# ---------------------------------------------------------------- 02 process groups, 04 point-to-point


def plot_subgroups(results: list, ax: Axes | None = None) -> Axes:
    """``process_groups.subgroup_sums`` results: ranks coloured by group, each with its group's sum."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(1.6 + 1.3 * len(results), 2.2))
    colours = {}
    for r in results:
        colour = colours.setdefault(tuple(r["members"]), f"C{len(colours)}")
        members = r["members"]
        if r["rank"] == members[0] and len(members) > 1:  # one bracket per group, under its ranks
            level = -0.45 - 0.2 * (len(colours) - 1)
            ax.plot(members, [level] * len(members), "o-", color=colour, alpha=0.6)
        ax.scatter([r["rank"]], [0], s=1400, color=colour, alpha=0.85)
        ax.text(r["rank"], 0, f"rank {r['rank']}\n{r['group']} #{r['group_rank']}",
                ha="center", va="center", fontsize=8, color="white")
        ax.text(r["rank"], 0.45, f"group sum {r['group_sum']:g}", ha="center", fontsize=8)
    ax.set_xlim(-0.7, len(results) - 0.3)
    ax.set_ylim(-0.45 - 0.2 * len(colours) - 0.15, 0.75)
    ax.axis("off")
    ax.set_title(f"new_group: {len(colours)} sub-groups, all_reduce inside each", fontsize=10)
    return ax


def plot_token_ring(results: list, ax: Axes | None = None) -> Axes:
    """Space-time diagram of ``p2p.pass_token``: a line per rank, an arrow per message, labelled by the token."""
    import matplotlib.pyplot as plt

    world_size = len(results)
    sends = sorted((hop, r["rank"], dst, value) for r in results for hop, dst, value in r["sends"])
    if ax is None:
        _, ax = plt.subplots(figsize=(1.2 + 0.8 * len(sends), 0.8 + 0.6 * world_size))
    for rank in range(world_size):
        ax.plot([0, len(sends)], [rank, rank], color="lightgray", zorder=0)
    for hop, src, dst, value in sends:
        ax.annotate("", xy=(hop, dst), xytext=(hop - 1, src),
                    arrowprops=dict(arrowstyle="->", color=f"C{src}", lw=1.5))
        ax.text(hop - 0.5, (src + dst) / 2, f"{value:g}", ha="center", va="center", fontsize=8,
                bbox=dict(boxstyle="round,pad=0.15", facecolor="white", edgecolor="none"))
    ax.set_yticks(range(world_size))
    ax.set_yticklabels([f"rank {r}" for r in range(world_size)])
    ax.set_ylim(world_size - 0.5, -0.5)
    ax.set_xlabel("message number (send on the left, recv on the right)")
    ax.set_title("pass_token: each rank recv()s from its left, adds 1, send()s to its right", fontsize=10)
    return ax


# ---------------------------------------------------------------- 08 DDP from scratch: the cost model


def plot_allreduce_fit(nbytes: list, seconds: list, latency: float, bandwidth: float,
                       ax: Axes | None = None) -> Axes:
    """Time of one all-reduce against its size, with the fitted line ``latency + bytes / bandwidth``."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(5, 4))
    ax.plot(nbytes, [1e3 * s for s in seconds], "o", label="one all-reduce (measured)")
    lo, hi = min(nbytes), max(nbytes)
    xs = [lo * (hi / lo) ** (i / 49) for i in range(50)]
    ax.plot(xs, [1e3 * (latency + x / bandwidth) for x in xs], "--",
            label=f"{1e6 * latency:.0f} us + bytes / {bandwidth / 1e9:.2g} GB/s")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("bytes per all-reduce")
    ax.set_ylabel("ms")
    ax.legend(fontsize=7)
    ax.set_title("latency, then bandwidth", fontsize=10)
    return ax
