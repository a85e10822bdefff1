"""Exercise 18.1 (hard), lesson 18_zero3_and_checkpoints.ipynb: a ZeRO-3 linear layer: gather for forward, gather again for backward, reduce-scatter.

Write zero3_linear() below (its docstring is the contract: what must hold), then check it:
    check("zero3_linear")                                 in the notebook
    python -m ddp_tutorial.exercises check zero3_linear   from a shell
The checker's ranks read this file afresh each time: an edit counts at once.
Hints, one at a time: python -m ddp_tutorial.exercises show zero3_linear [--hint 2 .. 3]
Start again from the stub: python -m ddp_tutorial.exercises reset zero3_linear
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ddp_tutorial.comm.collectives import all_gather_single, reduce_scatter_single


def zero3_linear(x: torch.Tensor, shard: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
    """``x @ W.T`` for a weight ``W`` of ``shape`` (out, in) that no rank holds whole, as ZeRO-3 computes it.

    ``shard`` (requires grad) is this rank's flat piece of ``W``: ``W`` flattened, zero-padded
    to ``s * n`` elements (``s = ceil(out * in / n)``, ``n`` the world size), piece ``rank``
    of ``s`` elements. ``x`` has shape (..., in). Return the (..., out) output; then, after
    ``loss.backward()`` on every rank (each with its own ``x``):
    - ``shard.grad`` is this rank's piece (same layout, shape ``(s,)``) of the *mean* over
      ranks of the full gradients of ``W``, as DDP averages them;
    - ``x.grad`` (when ``x`` requires grad) is the gradient through the full ``W``;
    - the communication was one all-gather of the shards in forward, one again in backward
      (the full weight is not kept between them), and one reduce-scatter of the gradient
      (``all_gather_single`` and ``reduce_scatter_single`` from ``ddp_tutorial.comm.collectives``);
      no all-reduce.
    Hints, from the idea to the code: ``show("zero3_linear", hint=1)``, 2, 3.
    """
    # Your code here; the checker calls zero3_linear(x, shard, shape) on every rank.
    raise NotImplementedError(
        'exercise 18.1 (zero3_linear): not started yet, as expected for a fresh stub: '
        'my_exercises/zero3_linear.py still raises NotImplementedError. Next: write zero3_linear() '
        'there (its docstring is the contract, lesson 18_zero3_and_checkpoints.ipynb explains it, '
        "show('zero3_linear') gives hints), then check again")
