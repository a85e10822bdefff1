"""Timelines and grids: DDP's communication overlapping backward, bucket sweeps, pipelines.

Used by ``08_ddp_from_scratch`` and ``10_model_parallel_ddp``, always drawn from
timestamps and values the workers really returned.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # matplotlib is imported when a plot is drawn, not with the package
    from matplotlib.axes import Axes


# ---------------------------------------------------------------- 10 model parallel


def plot_pipeline_timeline(events: list, ax: Axes | None = None, num_stages: int = 2, title: str = "",
                           unit: str = "ms", xmax: float | None = None) -> Axes:
    """Gantt chart of ``pipeline`` events ``(stage, micro_batch, start, end)``: a lane per stage,
    a bar per micro-batch (same colour = same micro-batch), white space = idle (``10_model_parallel_ddp``).
    ``xmax`` (in the events' unit) gives several charts one time axis."""
    import matplotlib.pyplot as plt

    scale = {"ms": 1e3, "s": 1.0, "units": 1.0}[unit]
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 0.6 + 0.6 * num_stages))
    xmax = xmax or max(e[3] for e in events)
    for stage, micro, start, end in events:
        ax.broken_barh([(start * scale, (end - start) * scale)], (stage - 0.35, 0.7),
                       facecolors=f"C{micro % 10}", edgecolor="black", linewidth=0.5)
        if end - start > 0.03 * xmax:  # a label only where it fits
            ax.text((start + end) / 2 * scale, stage, str(micro), ha="center", va="center", fontsize=8)
    ax.set_yticks(range(num_stages))
    ax.set_yticklabels([f"stage {s}\n(dev{s})" for s in range(num_stages)])
    ax.set_ylim(num_stages - 0.5, -0.5)
    ax.set_xlim(0, xmax * scale * 1.02)
    ax.set_xlabel("time (whole-batch stage time = 1)" if unit == "units" else f"time ({unit})")
    ax.set_title(title, fontsize=10)
    return ax


def plot_stage_grid(results: list, ax: Axes | None = None) -> Axes:
    """The stages x replicas grid of ``pipeline_grid``: a box per rank, p2p arrows along each
    pipeline, all-reduce links between the ranks holding the same stage (``10_model_parallel_ddp``)."""
    import matplotlib.pyplot as plt

    num_stages = max(r["stage"] for r in results) + 1
    num_replicas = max(r["replica"] for r in results) + 1
    if ax is None:
        _, ax = plt.subplots(figsize=(2.2 + 2.4 * num_stages, 0.8 + 1.3 * num_replicas))
    for r in results:
        x, y = 2.4 * r["stage"], 1.3 * r["replica"]
        ax.add_patch(plt.Rectangle((x - 0.6, y - 0.3), 1.2, 0.6, facecolor=f"C{r['stage']}", alpha=0.35,
                                   edgecolor="black"))
        ax.text(x, y, f"rank {r['rank']}\nstage {r['stage']}", ha="center", va="center", fontsize=9)
        if r["stage"] + 1 < num_stages:
            ax.annotate("", xy=(x + 1.8, y + 0.08), xytext=(x + 0.6, y + 0.08),
                        arrowprops=dict(arrowstyle="->", color="black"))
            ax.annotate("", xy=(x + 0.6, y - 0.08), xytext=(x + 1.8, y - 0.08),
                        arrowprops=dict(arrowstyle="->", color="gray"))
            ax.text(x + 1.2, y + 0.18, "activations", ha="center", fontsize=7)
            ax.text(x + 1.2, y - 0.28, "gradients", ha="center", fontsize=7, color="gray")
        if r["replica"] + 1 < num_replicas:
            ax.annotate("", xy=(x, y + 1.0), xytext=(x, y + 0.3),
                        arrowprops=dict(arrowstyle="<->", color=f"C{r['stage']}", linestyle="--"))
            ax.text(x + 0.08, y + 0.65, "all-reduce\ngradients", fontsize=7, va="center")
    ax.set_yticks([1.3 * p for p in range(num_replicas)])
    ax.set_yticklabels([f"replica {p}" for p in range(num_replicas)])
    ax.set_xlim(-0.9, 2.4 * (num_stages - 1) + 0.9)
    ax.set_ylim(1.3 * (num_replicas - 1) + 0.5, -0.5)
    ax.set_xticks([])
    for side in ("top", "right", "bottom"):
        ax.spines[side].set_visible(False)
    ax.set_title(f"{num_stages} pipeline stages x {num_replicas} data-parallel replicas", fontsize=10)
    return ax


# ---------------------------------------------------------------- 08 DDP from scratch


def plot_overlap_timeline(timelines: list, ax: Axes | None = None, title: str = "") -> Axes:
    """``overlap.timeline`` results (one per rank): for each rank a lane of gradients becoming
    ready during backward and a lane of bucket all-reduces (launch to done), same colour = same bucket."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(8, 0.8 + 1.1 * len(timelines)))
    labels = []
    for rank, tl in enumerate(timelines):
        bucket_of = {i: b for b, indices in enumerate(tl["buckets"]) for i in indices}
        y_grad, y_comm = 2 * rank, 2 * rank + 1
        ms = {(kind, i): 1e3 * t for kind, i, t in tl["events"]}
        ax.broken_barh([(0, 1e3 * tl["backward"])], (y_grad - 0.3, 0.6), facecolors="0.9", edgecolor="0.6")
        for (kind, i), t in ms.items():
            if kind == "ready":
                ax.plot([t, t], [y_grad - 0.3, y_grad + 0.3], color=f"C{bucket_of[i] % 10}", linewidth=2)
            elif kind == "launch" and ("done", i) in ms:
                ax.broken_barh([(t, ms[("done", i)] - t)], (y_comm - 0.3, 0.6), facecolors=f"C{i % 10}",
                               edgecolor="black", linewidth=0.5, alpha=0.8)
        labels += [f"rank {rank}\nbackward", f"rank {rank}\nall-reduce"]
    ax.set_yticks(range(len(labels)))
    ax.set_yticklabels(labels, fontsize=8)
    ax.set_ylim(len(labels) - 0.5, -0.5)
    ax.set_xlabel("ms since loss.backward() was called")
    ax.set_title(title or "BucketedDDP: ticks = a gradient is ready, bars = a bucket's all-reduce "
                 "(launch to done); colour = bucket", fontsize=9)
    return ax


def plot_bucket_sweep(rows: list, latency: float, bandwidth: float, ax: Axes | None = None,
                      floor: float | None = None) -> Axes:
    """``buckets.bucket_sweep`` rows against bucket size: step time, communication alone, and the
    model ``buckets * latency + bytes / bandwidth`` with its fitted constants."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(6.5, 4))
    caps = [r["bucket_cap_mb"] for r in rows]
    ax.plot(caps, [1e3 * r["step"] for r in rows], "o-", label="BucketedDDP step (measured)")
    ax.plot(caps, [1e3 * r["comm"] for r in rows], "s", color="C1", label="its all-reduces alone (measured)")
    model = [1e3 * (r["buckets"] * latency + r["bytes"] / bandwidth) for r in rows]
    ax.plot(caps, model, "--", color="C1",
            label=f"model: buckets x {1e6 * latency:.0f} us + bytes / {bandwidth / 1e9:.2g} GB/s")
    if floor is not None:
        ax.axhline(1e3 * floor, color="gray", linestyle=":", label="step without communication")
    for cap, r in zip(caps, rows):
        ax.annotate(str(r["buckets"]), (cap, 1e3 * r["comm"]), textcoords="offset points", xytext=(0, -12),
                    ha="center", fontsize=7, color="C1")
    ax.set_xscale("log")
    ax.set_xlabel("bucket_cap_mb (numbers: how many buckets)")
    ax.set_ylabel("ms")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=7)
    ax.set_title("bucket size: fewer calls vs. later start", fontsize=10)
    return ax


def plot_exposed(timed: dict, ax: Axes | None = None, alone: str = "comm", title: str = "") -> Axes:
    """Bars per wrapper from ``overlap.slowest_rank``: exposed communication (step - local) beside
    ``alone``: its all-reduces alone (``comm``) or its time on a simulated wire (``wire``)."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(7, 3.4))
    from ddp_tutorial.data_parallel.overlap import NAMES

    at = range(len(timed))
    ax.bar([i - 0.2 for i in at], [1e3 * (t["step"] - t["local"]) for t in timed.values()], 0.4,
           label="exposed: step - local compute", color="C3")
    ax.bar([i + 0.2 for i in at], [1e3 * t[alone] for t in timed.values()], 0.4, color="0.6",
           label={"comm": "its all-reduces alone, back to back", "wire": "its time on the wire"}[alone])
    ax.set_xticks(list(at))
    ax.set_xticklabels([NAMES[k] for k in timed])
    ax.set_ylabel("ms per training step")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    return ax


def plot_link_steps(timed: dict, ax: Axes | None = None, title: str = "") -> Axes:
    """Bars of each wrapper's step over ``overlap.over_simulated_link``'s wire, split into the bare
    model's step (the compute) and the rest; a dashed line where the compute plus the wire time ends."""
    import matplotlib.pyplot as plt

    from ddp_tutorial.data_parallel.overlap import NAMES

    if ax is None:
        _, ax = plt.subplots(figsize=(6, 3.4))
    at = list(range(len(timed)))
    steps = [1e3 * t["step"] for t in timed.values()]
    compute = [1e3 * t["local"] for t in timed.values()]
    ax.bar(at, steps, 0.5, color="C0", label="training step over the wire")
    ax.bar(at, compute, 0.5, color="0.75", label="bare model's step (no communication)")
    for i, t in zip(at, timed.values()):
        ax.hlines(1e3 * (t["local"] + t["wire"]), i - 0.3, i + 0.3, colors="C3", linestyles="--",
                  label="compute + wire time, if nothing overlaps" if i == 0 else None)
    ax.set_xticks(at)
    ax.set_xticklabels([NAMES[k] for k in timed])
    ax.set_ylabel("ms per training step (best)")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, loc="lower right")
    return ax
