"""Exercise 7.1 (hard), lesson 07_ddp_from_scratch.ipynb: the bucketed DDP gradient hook: all-reduce and average.

Write bucketed_grad_hooks() below (its docstring says exactly what to do), then check it:
    check("bucketed_grad_hooks")                                 in the notebook
    python -m ddp_tutorial.exercises check bucketed_grad_hooks   from a shell
The checker's ranks read this file afresh each time: an edit counts at once.
A hint: python -m ddp_tutorial.exercises show bucketed_grad_hooks
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
    - Give each bucket one flat tensor (the sum of its parameters' numel, their dtype
      and device) and each parameter its slice of it.
    - Register a hook on every parameter: ``p.register_post_accumulate_grad_hook(hook)``
      calls ``hook(p)`` once ``p.grad`` is final. Put ``p.grad / world_size`` into its slice.
    - When the last gradient of bucket ``b`` is in, and buckets ``0 .. b-1`` have
      started, start ONE all-reduce of the bucket's flat tensor with
      ``dist.all_reduce(flat, async_op=True)`` (keep the handle): it runs while backward
      computes the remaining gradients. Every rank starts the buckets in the same order.
    - ``finish()``, which the caller runs after ``loss.backward()``, waits for every
      handle, copies each parameter's slice back into ``p.grad`` and resets the
      counters for the next backward.
    """
    # Your code here; the checker calls bucketed_grad_hooks(params, buckets) on every rank.
    raise NotImplementedError(
        'exercise 7.1 (bucketed_grad_hooks): not implemented yet: open '
        'my_exercises/bucketed_grad_hooks.py and write it; lesson 07_ddp_from_scratch.ipynb '
        'explains it')
