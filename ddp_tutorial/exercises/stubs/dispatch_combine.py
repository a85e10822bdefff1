"""Exercise 21.1 (medium), lesson 21_expert_parallel.ipynb: dispatch rows by split sizes and combine them back.

Write dispatch_combine() below (its docstring is the contract: what must hold), then check it:
    check("dispatch_combine")                                 in the notebook
    python -m ddp_tutorial.exercises check dispatch_combine   from a shell
The checker's ranks read this file afresh each time: an edit counts at once.
A hint: python -m ddp_tutorial.exercises show dispatch_combine
Start again from the stub: python -m ddp_tutorial.exercises reset dispatch_combine
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist


def dispatch_combine(x: torch.Tensor, destination: torch.Tensor,
                     compute: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """Send row ``x[i]`` to rank ``destination[i]``, apply ``compute`` there, return the results in place of the rows.

    ``x`` (rows, features) and ``destination`` (rows,), int64 rank numbers, are this rank's; a
    rank may send no row at all, or all of them to one rank. Every rank calls
    ``compute(received)`` once, on all the rows that arrived (rows, features) in any order; it
    works row by row and returns a tensor of the same shape. Return ``out``, shaped like ``x``,
    where ``out[i]`` is what ``compute`` on rank ``destination[i]`` made of ``x[i]``, with a
    gradient: backward through ``out`` brings each row's gradient home to ``x`` (and to what
    ``compute`` used), on every rank. Use ``dist.all_to_all_single`` only: one for the counts,
    one to send the rows, one to bring the results back; in backward, the last two reversed.
    """
    # Your code here; the checker calls dispatch_combine(x, destination, compute) on every rank.
    raise NotImplementedError(
        'exercise 21.1 (dispatch_combine): not started yet, as expected for a fresh stub: '
        'my_exercises/dispatch_combine.py still raises NotImplementedError. Next: write '
        'dispatch_combine() there (its docstring is the contract, lesson 21_expert_parallel.ipynb '
        "explains it, show('dispatch_combine') gives hints), then check again")
