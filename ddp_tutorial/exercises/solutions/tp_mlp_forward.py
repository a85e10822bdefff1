"""Exercise 15.1, reference solution: a column-parallel then a row-parallel linear, f and g around them.

Split the hidden units of ``relu(x W1^T + b1) W2^T + b2`` over the ranks. Rank ``r`` holds
the rows of ``W1`` and ``b1`` of its hidden units (column-parallel: a slice of the first
layer's outputs) and the same units' columns of ``W2`` (row-parallel: a slice of the second
layer's inputs). The ReLU acts on each hidden unit alone, so each rank computes its slice of
the hidden activations without talking to anyone. The output is a sum over all hidden
units, so each rank's ``h_r W2_r^T`` is a partial sum: one all-reduce (SUM) adds the
ranks' parts. ``b2`` belongs to the whole sum: add it once, after the all-reduce; added
before it, every rank would contribute it and the output would hold ``n b2``.

Backward mirrors it (Megatron-LM's ``f`` and ``g``): ``g`` is the all-reduce in forward and
the identity in backward, since every rank already holds the whole output's gradient; ``f``
is the identity in forward and an all-reduce in backward, since each rank's gradient of
``x`` covers its own hidden units only. Two autograd functions, one all-reduce each way.
``ddp_tutorial.tensor_parallel.split_mlp`` has the same pair as ``CopyToParallel`` and
``ReduceFromParallel``.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


class EnterParallel(torch.autograd.Function):
    """``f``: the identity in forward; in backward, the sum of the ranks' input gradients."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        grad = grad.clone()  # my hidden units' share of x's gradient
        dist.all_reduce(grad)
        return grad


class LeaveParallel(torch.autograd.Function):
    """``g``: the sum of the ranks' partial outputs in forward; the identity in backward."""

    @staticmethod
    def forward(ctx, partial: torch.Tensor) -> torch.Tensor:
        total = partial.clone()
        dist.all_reduce(total)
        return total

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return grad  # every rank holds the whole output's gradient: each term of the sum gets it


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
    h = torch.relu(EnterParallel.apply(x) @ w1_shard.T + b1_shard)  # my hidden units: no communication
    partial = h @ w2_shard.T  # their share of every output
    return LeaveParallel.apply(partial) + b2  # the sum over all hidden units, then the bias once
