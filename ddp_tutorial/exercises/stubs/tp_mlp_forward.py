"""Exercise 15.1 (medium), lesson 15_tensor_parallel.ipynb: a column- and row-parallel MLP by hand: f and g.

Write tp_mlp_forward() below (its docstring is the contract: what must hold), then check it:
    check("tp_mlp_forward")                                 in the notebook
    python -m ddp_tutorial.exercises check tp_mlp_forward   from a shell
The checker's ranks read this file afresh each time: an edit counts at once.
A hint: python -m ddp_tutorial.exercises show tp_mlp_forward
Start again from the stub: python -m ddp_tutorial.exercises reset tp_mlp_forward
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def tp_mlp_forward(x: torch.Tensor, w1_shard: torch.Tensor, b1_shard: torch.Tensor, w2_shard: torch.Tensor,
                   b2: torch.Tensor) -> torch.Tensor:
    """``relu(x @ W1.T + b1) @ W2.T + b2`` with the hidden units split over the ranks, forward and backward.

    Every rank gets the same ``x`` (batch, in). ``w1_shard`` (hidden/n, in) and ``b1_shard``
    (hidden/n,) are this rank's rows of ``W1`` and ``b1``; ``w2_shard`` (out, hidden/n) the
    same hidden units' columns of ``W2``; ``b2`` (out,) is whole on every rank. Return the full
    output (batch, out), the same on every rank, leaving the arguments unchanged. It must be
    differentiable: after every rank calls ``backward()`` on the same loss of the output,
    ``x.grad`` and ``b2.grad`` are the unsplit MLP's, and each shard's gradient is its slice
    of the unsplit one. Exactly one all-reduce (SUM) in forward and one in backward: write
    Megatron's ``f`` and ``g`` as ``torch.autograd.Function`` classes in this file (``dist``'s
    collectives are not differentiable by themselves).
    """
    # Your code here; the checker calls tp_mlp_forward(x, w1_shard, b1_shard, w2_shard, b2) on every rank.
    raise NotImplementedError(
        'exercise 15.1 (tp_mlp_forward): not started yet, as expected for a fresh stub: '
        'my_exercises/tp_mlp_forward.py still raises NotImplementedError. Next: write '
        'tp_mlp_forward() there (its docstring is the contract, lesson 15_tensor_parallel.ipynb '
        "explains it, show('tp_mlp_forward') gives hints), then check again")
