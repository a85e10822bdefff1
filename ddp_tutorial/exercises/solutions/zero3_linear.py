"""Exercise 18.1, reference solution: a ZeRO-3 linear layer, gathered for forward, gathered again for backward.

The layer's weight lives on each rank as a flat, padded shard (``Zero3``'s layout). Forward
all-gathers the shards into the full weight, computes, and keeps only the input and the
shard for backward: the full weight is freed when forward returns. Backward all-gathers it
again (a second all-gather: the price of never holding every weight at once), computes the
input's gradient and the full weight's gradient, and reduce-scatters the latter so that
each rank receives the slice of the summed gradients that matches its shard; divided by N
it is the mean, as DDP. An all-reduce would give every rank the whole gradient: N times
the memory ZeRO-3 is there to save, for more traffic.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ddp_tutorial.comm.collectives import all_gather_single, reduce_scatter_single


def gathered_weight(shard: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
    """Every rank's shard, concatenated in rank order, padding dropped, as a ``shape`` matrix."""
    full = shard.new_empty(shard.numel() * dist.get_world_size())
    all_gather_single(full, shard.detach().contiguous())
    return full[:shape[0] * shape[1]].view(shape)


class GatheredLinear(torch.autograd.Function):
    """``x @ W.T`` with ``W`` gathered from shards in forward and again in backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, shard: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
        weight = gathered_weight(shard, shape)
        ctx.save_for_backward(x, shard)  # not the full weight: it is freed when forward returns
        ctx.shape = shape
        return x @ weight.t()

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        x, shard = ctx.saved_tensors
        weight = gathered_weight(shard, ctx.shape)  # the second all-gather
        grad_x = grad_out @ weight
        grad_weight = grad_out.reshape(-1, grad_out.shape[-1]).t() @ x.reshape(-1, x.shape[-1])
        n = dist.get_world_size()
        padded = grad_weight.new_zeros(shard.numel() * n)  # the shards' padding gets a zero gradient
        padded[:grad_weight.numel()] = grad_weight.reshape(-1)
        grad_shard = torch.empty_like(shard)
        reduce_scatter_single(grad_shard, padded)  # my slice, summed over the ranks
        return grad_x, grad_shard / n, None  # the mean, as DDP


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
    return GatheredLinear.apply(x, shard, tuple(shape))
