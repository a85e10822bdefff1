"""Exercise 14.1 (hard), lesson 14_sharding.ipynb: one ZeRO-1 step: reduce-scatter, Adam on my slice, all-gather.

Write zero1_step() below (its docstring is the contract: what must hold), then check it:
    check("zero1_step")                                 in the notebook
    python -m ddp_tutorial.exercises check zero1_step   from a shell
The checker's ranks read this file afresh each time: an edit counts at once.
Hints, one at a time: python -m ddp_tutorial.exercises show zero1_step [--hint 2 .. 3]
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
    # Your code here; the checker calls zero1_step(params_flat, grads_flat, state, lr) on every rank.
    raise NotImplementedError(
        'exercise 14.1 (zero1_step): not started yet, as expected for a fresh stub: '
        'my_exercises/zero1_step.py still raises NotImplementedError. Next: write zero1_step() '
        'there (its docstring is the contract, lesson 14_sharding.ipynb explains it, '
        "show('zero1_step') gives hints), then check again")
