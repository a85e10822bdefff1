"""Exercise 14.1, reference solution: a column-parallel then a row-parallel linear, one all-reduce.

Split the hidden units of ``relu(x W1^T + b1) W2^T + b2`` over the ranks. Rank ``r`` holds
the rows of ``W1`` and ``b1`` of its hidden units (column-parallel: a slice of the first
layer's outputs) and the same units' columns of ``W2`` (row-parallel: a slice of the second
layer's inputs). The ReLU acts on each hidden unit alone, so each rank computes its slice of
the hidden activations without talking to anyone. The output is a sum over all hidden
units, so each rank's ``h_r W2_r^T`` is a partial sum: one all-reduce (SUM) adds the
ranks' parts. ``b2`` belongs to the whole sum: add it once, after the all-reduce; added
before it, every rank would contribute it and the output would hold ``n b2``. Megatron-LM
calls the two identities around the split ``f`` and ``g``; ``ddp_tutorial.tensor_parallel.split_mlp``
makes them autograd functions, so that backward works too.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def tp_mlp_forward(x: torch.Tensor, w1_shard: torch.Tensor, b1_shard: torch.Tensor, w2_shard: torch.Tensor,
                   b2: torch.Tensor) -> torch.Tensor:
    """Forward of ``relu(x @ W1.T + b1) @ W2.T + b2`` with the hidden units split over the ranks.

    Every rank gets the same ``x`` (batch, in). ``w1_shard`` (hidden/n, in) and ``b1_shard``
    (hidden/n,) are this rank's rows of ``W1`` and ``b1``; ``w2_shard`` (out, hidden/n) the
    same hidden units' columns of ``W2``; ``b2`` (out,) is whole on every rank. Compute this
    rank's slice of the hidden activations, its partial output, then exactly one
    ``dist.all_reduce`` (SUM), and add ``b2`` once. Return the full output (batch, out),
    the same on every rank; leave the arguments unchanged.
    """
    h = torch.relu(x @ w1_shard.T + b1_shard)  # my hidden units: no communication
    partial = h @ w2_shard.T  # their share of every output
    dist.all_reduce(partial)  # the sum over all hidden units
    return partial + b2  # the bias once, after the sum
