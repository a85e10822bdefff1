"""Exercise 13.1 (hard), lesson 13_sharding.ipynb: one ZeRO-1 step: reduce-scatter, Adam on my slice, all-gather.

Write zero1_step() below (its docstring says exactly what to do), then check it:
    check("zero1_step")                                 in the notebook
    python -m ddp_tutorial.exercises check zero1_step   from a shell
The checker's ranks read this file afresh each time: an edit counts at once.
A hint: python -m ddp_tutorial.exercises show zero1_step
Start again from the stub: python -m ddp_tutorial.exercises reset zero1_step
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ddp_tutorial.comm.collectives import all_gather_single, reduce_scatter_single


def zero1_step(params_flat: torch.Tensor, grads_flat: torch.Tensor, state: dict, lr: float) -> None:
    """One Adam step of a ZeRO-1 data-parallel job, in place on ``params_flat`` and ``state``.

    Every rank holds the same ``params_flat`` (1-D, ``numel`` a multiple of the world size
    ``n``) and its own ``grads_flat`` (the gradient of its own batch, same shape). Rank
    ``r`` owns the slice ``r * s : (r + 1) * s`` with ``s = numel // n``; ``state`` is its
    Adam state for that slice only: ``{"step": int, "exp_avg": tensor(s), "exp_avg_sq":
    tensor(s)}``, zeros and step 0 before the first call. Do:
    1. reduce-scatter the gradients (``reduce_scatter_single(out, grads_flat)`` from
       ``ddp_tutorial.comm.collectives``, ``dist.reduce_scatter_tensor`` in older torch), then
       divide by ``n``: the mean gradient of my slice, as DDP would average it;
    2. Adam on my slice, as ``torch.optim.Adam(lr=lr)`` does it (betas 0.9, 0.999, eps 1e-8,
       no weight decay): ``step += 1``; ``m = b1 m + (1 - b1) g``; ``v = b2 v + (1 - b2) g²``;
       ``p -= lr (m / (1 - b1^step)) / (sqrt(v / (1 - b2^step)) + eps)``;
    3. all-gather every rank's slice into ``params_flat`` (``all_gather_single``), so that
       all ranks end with the same, fully updated parameters.
    Return nothing; after the call ``params_flat`` equals what one process with
    ``torch.optim.Adam`` and the gradients averaged over all ranks would hold.
    """
    # Your code here; the checker calls zero1_step(params_flat, grads_flat, state, lr) on every rank.
    raise NotImplementedError(
        'exercise 13.1 (zero1_step): not implemented yet: open my_exercises/zero1_step.py and write'
        ' it; lesson 13_sharding.ipynb explains it')
