"""Exercise 14.1, reference solution: one ZeRO-1 step, reduce-scatter, Adam on my slice, all-gather.

Adam is elementwise, so rank ``r`` can own the elements ``r s .. (r + 1) s - 1`` (``s =
numel / n``) and keep Adam's two state tensors for those only: ``1/n`` of DDP's optimizer
memory. The step needs the *mean* gradient of its own slice only, and a reduce-scatter
delivers exactly that (the sum; divide by ``n``). Adam then updates the slice of the
parameters (a view of ``params_flat``, so in place), and an all-gather sends every rank
every updated slice. A reduce-scatter plus an all-gather carry the same bytes as DDP's one
all-reduce (a ring all-reduce is the two), so ZeRO-1 saves memory at no extra traffic.
The all-gather's input is this rank's slice of its own output: an in-place all-gather,
which NCCL documents (``sendbuff == recvbuff + rank * count``), FSDP2 relies on and gloo
handles; a copy (``mine.clone()``) works as well. What must not happen is an input that
overlaps another rank's place in the output. ``ddp_tutorial.sharding.zero`` does the same
for a whole model (``ShardedOptimizer``).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ddp_tutorial.comm.collectives import all_gather_single, reduce_scatter_single

BETAS, EPS = (0.9, 0.999), 1e-8  # torch.optim.Adam's defaults


def zero1_step(params_flat: torch.Tensor, grads_flat: torch.Tensor, state: dict, lr: float) -> None:
    """One Adam step of a ZeRO-1 data-parallel job, in place on ``params_flat`` and ``state``.

    Every rank holds the same ``params_flat`` (1-D, ``numel`` a multiple of the world size
    ``n``) and its own ``grads_flat`` (the gradient of its own batch, same shape). Rank
    ``r`` owns the slice ``r * s : (r + 1) * s`` with ``s = numel // n``; ``state`` is its
    Adam state for that slice only: ``{"step": int, "exp_avg": tensor(s), "exp_avg_sq":
    tensor(s)}``, zeros and step 0 before the first call.
    After the call (return nothing):
    - ``params_flat`` equals, on every rank, what one process holds after
      ``torch.optim.Adam([p], lr=lr).step()`` (betas 0.9, 0.999, eps 1e-8, no weight decay)
      with ``p.grad`` the mean of all ranks' ``grads_flat``: what DDP + Adam gives;
    - ``state`` is that Adam's state for this rank's slice only, ``state["step"]`` counted;
    - the communication was one reduce-scatter of the gradients, then one all-gather of
      the parameters (``reduce_scatter_single`` and ``all_gather_single`` from
      ``ddp_tutorial.comm.collectives``): DDP's traffic, not an all-reduce more.
    Hints, from the idea to the formulas: ``show("zero1_step", hint=1)``, 2, 3.
    """
    with torch.no_grad():  # an optimizer step: no autograd graph
        n, rank = dist.get_world_size(), dist.get_rank()
        s = params_flat.numel() // n
        grad = torch.empty(s, dtype=grads_flat.dtype, device=grads_flat.device)
        reduce_scatter_single(grad, grads_flat)  # my slice, summed over the ranks
        grad.div_(n)  # the mean, as DDP
        b1, b2 = BETAS
        state["step"] += 1
        m, v, t = state["exp_avg"], state["exp_avg_sq"], state["step"]
        m.mul_(b1).add_(grad, alpha=1 - b1)
        v.mul_(b2).addcmul_(grad, grad, value=1 - b2)
        mine = params_flat[rank * s:(rank + 1) * s]  # a view: updating it updates params_flat
        denom = (v / (1 - b2 ** t)).sqrt_().add_(EPS)
        mine.addcdiv_(m, denom, value=-lr / (1 - b1 ** t))
        all_gather_single(params_flat, mine)  # in place: mine is exactly this rank's place in the output
