"""Exercise 8.1, reference solution: the bucketed DDP gradient hook, all-reduce and average.

Each bucket owns one flat tensor; a parameter's gradient is divided by the world size
straight into its slice of it (the sum of the shares is the mean, and the division
happens while nothing waits). A counter per bucket says when its last gradient has
arrived. Buckets are launched strictly in order: a bucket that fills early waits for
the ones before it, because every rank must start the same collectives in the same
order. ``finish`` waits for the all-reduces and copies the means back into ``.grad``.
``ddp_from_scratch.BucketedDDP`` is the same idea inside a module, with unused
parameters and buffers handled too.
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
    world_size = dist.get_world_size()
    flats, slices, bucket_of = [], {}, {}
    for b, indices in enumerate(buckets):
        first = params[indices[0]]
        flat = torch.zeros(sum(params[i].numel() for i in indices), dtype=first.dtype, device=first.device)
        offset = 0
        for i in indices:
            slices[i] = flat[offset:offset + params[i].numel()].view_as(params[i])
            bucket_of[i] = b
            offset += params[i].numel()
        flats.append(flat)
    missing = [len(indices) for indices in buckets]
    works: list = []

    def hook(index: int, param: torch.Tensor) -> None:
        torch.div(param.grad, world_size, out=slices[index])
        missing[bucket_of[index]] -= 1
        while len(works) < len(buckets) and missing[len(works)] == 0:  # the next bucket in order is full
            works.append(dist.all_reduce(flats[len(works)], async_op=True))

    for i, p in enumerate(params):
        p.register_post_accumulate_grad_hook(lambda param, i=i: hook(i, param))

    def finish() -> None:
        for work in works:
            work.wait()
        for i, p in enumerate(params):
            p.grad.copy_(slices[i])
        works.clear()
        missing[:] = [len(indices) for indices in buckets]

    return finish
