"""Where the tokens of a mixture of experts go: the send/receive matrix and the load per expert.

Used by ``21_expert_parallel``, drawn from the counts the workers returned (``expert_parallel.dispatch``:
each rank's ``sent``, the tokens it sends to each expert; ``expert_parallel.routing.balance_run``:
the tokens per expert at every step).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # matplotlib is imported when a plot is drawn, not with the package
    from matplotlib.axes import Axes


def token_matrix(sent: Sequence[Sequence[int]]) -> list[list[int]]:
    """``matrix[src][dst]``: rows rank ``src`` sends to rank ``dst``, from each rank's count per expert
    (the experts split evenly, in order). Row ``src`` is what ``src`` sends; column ``dst`` what ``dst`` receives."""
    n = len(sent)
    per_rank = len(sent[0]) // n
    return [[sum(row[dst * per_rank:(dst + 1) * per_rank]) for dst in range(n)] for row in sent]


def plot_token_matrix(sent: Sequence[Sequence[int]], ax: Axes | None = None, title: str = "") -> Axes:
    """A heat map of ``token_matrix(sent)``: each cell the rows one rank sends another, written in it."""
    import matplotlib.pyplot as plt

    matrix = token_matrix(sent)
    n = len(matrix)
    if ax is None:
        _, ax = plt.subplots(figsize=(1.0 + 0.9 * n, 0.8 + 0.9 * n))
    ax.imshow(matrix, cmap="Blues", vmin=0, vmax=max(1, max(map(max, matrix))))
    top = max(1, max(map(max, matrix)))
    for src in range(n):
        for dst in range(n):
            value = matrix[src][dst]
            ax.text(dst, src, str(value), ha="center", va="center", color="white" if value > top / 2 else "black")
    ax.set_xticks(range(n), [str(r) for r in range(n)])
    ax.set_yticks(range(n), [str(r) for r in range(n)])
    ax.set_xlabel("to rank (its experts)")
    ax.set_ylabel("from rank (its tokens)")
    ax.set_title(title or f"tokens sent, {n} ranks")
    return ax


def plot_expert_load(counts: Sequence[Sequence[int]], ax: Axes | None = None, title: str = "") -> Axes:
    """Tokens per expert (one line each) against the training step."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(5, 3))
    for e in range(len(counts[0])):
        ax.plot([c[e] for c in counts], label=f"expert {e}")
    ax.set_xlabel("step")
    ax.set_ylabel("tokens (of the batch)")
    ax.set_title(title or "tokens per expert")
    ax.legend(fontsize="small")
    return ax
