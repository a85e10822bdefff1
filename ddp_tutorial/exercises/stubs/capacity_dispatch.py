"""Exercise 21.2 (hard), lesson 21_expert_parallel.ipynb: dispatch with a capacity factor: the overflow dropped before it travels.

Write capacity_dispatch() below (its docstring is the contract: what must hold), then check it:
    check("capacity_dispatch")                                 in the notebook
    python -m ddp_tutorial.exercises check capacity_dispatch   from a shell
The checker's ranks read this file afresh each time: an edit counts at once.
Hints, one at a time: python -m ddp_tutorial.exercises show capacity_dispatch [--hint 2 .. 3]
Start again from the stub: python -m ddp_tutorial.exercises reset capacity_dispatch
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.distributed as dist


def capacity_dispatch(x: torch.Tensor, chosen: torch.Tensor,
                      compute: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], *,
                      num_experts: int, capacity_factor: float) -> torch.Tensor:
    """The output of an expert-parallel MoE layer whose experts take at most ``C`` assignments each from this rank.

    ``x`` (tokens, features) are this rank's tokens; ``chosen`` (tokens, k), int64, the ``k``
    different experts each token chose (numbers ``0 .. num_experts - 1``). The experts are split
    over the ``n`` ranks in equal contiguous blocks: rank ``r`` holds experts
    ``r * num_experts / n`` to ``(r + 1) * num_experts / n - 1``. A rank may hold no token.

    Capacity: each expert takes at most ``C = ceil(capacity_factor * tokens * k / num_experts)``
    of this rank's assignments (``tokens`` = this rank's number of tokens), the first ``C`` in
    token order: token ``t``'s choices, in the order of ``chosen[t]``, before token ``t + 1``'s.
    The others are dropped on this rank: only kept assignments travel, one row each.

    Every rank calls ``compute(rows, experts)`` once, on all the rows that arrived, in any order,
    with each row's expert number (one of this rank's experts); it works row by row and returns
    a tensor shaped like ``rows``. Return ``out``, shaped like ``x``: ``out[t]`` is the sum, over
    token ``t``'s kept choices ``e``, of what ``compute`` on ``e``'s rank made of ``x[t]`` for
    ``e``. A dropped choice adds nothing: a token whose every choice was dropped gets a row of
    zeros (the residual connection outside the layer carries it on; do not add ``x``). No
    gradient is needed. Use ``dist.all_to_all_single`` only; two of those calls carry rows (the
    dispatch and the combine), each exactly the kept ones. Step by step:
    ``show("capacity_dispatch", hint=1)``, 2, 3.
    """
    # Your code here; the checker calls capacity_dispatch(x, chosen, compute, num_experts, capacity_factor) on every rank.
    raise NotImplementedError(
        'exercise 21.2 (capacity_dispatch): not started yet, as expected for a fresh stub: '
        'my_exercises/capacity_dispatch.py still raises NotImplementedError. Next: write '
        'capacity_dispatch() there (its docstring is the contract, lesson 21_expert_parallel.ipynb '
        "explains it, show('capacity_dispatch') gives hints), then check again")
