"""Exercise 8.1 (hard), lesson 08_ddp_from_scratch.ipynb: the bucketed DDP gradient hook: all-reduce and average.

Write bucketed_grad_hooks() below (its docstring is the contract: what must hold), then check it:
    check("bucketed_grad_hooks")                                 in the notebook
    python -m ddp_tutorial.exercises check bucketed_grad_hooks   from a shell
The checker's ranks read this file afresh each time: an edit counts at once.
Hints, one at a time: python -m ddp_tutorial.exercises show bucketed_grad_hooks [--hint 2 .. 3]
Start again from the stub: python -m ddp_tutorial.exercises reset bucketed_grad_hooks
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist


def bucketed_grad_hooks(params: list[torch.Tensor], buckets: list[list[int]]) -> Callable[[], None]:
    """Average ``params``' gradients over all ranks, bucket by bucket while backward runs; return ``finish``.

    ``buckets[b]`` lists indices into ``params``; the buckets hold every index once,
    in the order backward produces the gradients (``ddp_from_scratch.assign_buckets``).
    Register your hooks with ``p.register_post_accumulate_grad_hook(hook)``: it calls
    ``hook(p)`` once ``p.grad`` is final (``register_hook`` sees the gradient before it is
    accumulated, and is refused). The caller then runs ``loss.backward()`` and ``finish()``,
    for several steps. Must hold:
    - during backward, exactly ONE asynchronous all-reduce per bucket, of the bucket's
      gradients as one flat tensor, started as soon as the bucket's last gradient is in,
      buckets in order (every rank starts the same collectives in the same order);
    - after ``finish()``, every ``p.grad`` is the mean of that parameter's gradients over
      all ranks, and the next backward starts afresh.
    Hints, from the idea to the code: ``show("bucketed_grad_hooks", hint=1)``, 2, 3.
    """
    # Your code here; the checker calls bucketed_grad_hooks(params, buckets) on every rank.
    raise NotImplementedError(
        'exercise 8.1 (bucketed_grad_hooks): not started yet, as expected for a fresh stub: '
        'my_exercises/bucketed_grad_hooks.py still raises NotImplementedError. Next: write '
        'bucketed_grad_hooks() there (its docstring is the contract, lesson '
        "08_ddp_from_scratch.ipynb explains it, show('bucketed_grad_hooks') gives hints), then "
        'check again')
