"""Exercise 23.5 (medium), lesson 23_how_fast.ipynb: the largest model whose training states fit a layout.

Write largest_model() below (its docstring is the contract: what must hold), then check it:
    check("largest_model")                                 in the notebook
    python -m ddp_tutorial.exercises check largest_model   from a shell
The checker's ranks read this file afresh each time: an edit counts at once.
Hints, one at a time: python -m ddp_tutorial.exercises show largest_model [--hint 2 .. 3]
Start again from the stub: python -m ddp_tutorial.exercises reset largest_model
"""

from __future__ import annotations

import math


def largest_model(memory_gib: float, reserve_gib: float, gpus: int, *, tp: int, pp: int, zero: int) -> int:
    """Return the largest parameter count N (an int) whose training states fit every GPU.

    ``gpus`` GPUs of ``memory_gib`` GiB each (2**30 bytes, as torch and the course's calculator print
    it) train an N-parameter model with mixed-precision Adam: bf16 weights and gradients, fp32 master
    weights, m and v. ``reserve_gib`` of each GPU is kept for activations, buffers and the CUDA
    context; the states must fit in the rest. The GPUs are split ``tp`` x ``pp`` x dp (``gpus`` is a
    multiple of ``tp * pp``): tensor and pipeline parallelism divide the model evenly (embeddings and
    norms included: assume every tensor splits), and ZeRO stage ``zero`` (0: plain data parallelism,
    1, 2 or 3) shards over the data-parallel ranks. Shares are exact fractions (no rounding up to
    whole parameters per rank); the largest N whose states fit (at most the budget) is the answer.
    Pure arithmetic.
    """
    # Your code here; the checker calls largest_model(memory_gib, reserve_gib, gpus, tp, pp, zero) on every rank.
    raise NotImplementedError(
        'exercise 23.5 (largest_model): not started yet, as expected for a fresh stub: '
        'my_exercises/largest_model.py still raises NotImplementedError. Next: write '
        'largest_model() there (its docstring is the contract, lesson 23_how_fast.ipynb explains '
        "it, show('largest_model') gives hints), then check again")
