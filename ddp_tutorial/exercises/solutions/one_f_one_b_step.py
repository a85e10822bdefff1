"""Exercise 19.2, reference solution: one training step of a pipeline stage under 1F1B, with real messages.

A forward receives its input from the previous stage (``irecv``, waited for: nothing to compute
without it), runs the stage and sends the output on (``isend``, not waited for: a send that
blocked would meet its neighbour's send of a gradient in the steady state and both would wait).
A backward receives the output's gradient, runs ``backward`` (the parameters' ``.grad`` add up
over the micro-batches) and sends the input's gradient back. The last stage divides each
micro-batch's loss by ``m``, so the gradients are the global batch's mean. Warm-up of
``min(p - 1 - s, m)`` forwards, then one forward and one backward in turn, then the backwards
left; every send is waited for before the step returns.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist
from torch import nn


def one_f_one_b_step(module: nn.Module, stage: int, num_stages: int, *, num_micro: int,
                     micro_batches: Sequence[torch.Tensor] | None,
                     loss_fn: Callable[[torch.Tensor, int], torch.Tensor] | None,
                     shape: tuple[int, ...]) -> torch.Tensor | None:
    """Run one training step of pipeline stage ``stage`` of ``num_stages`` (this rank is stage ``stage``).

    ``module`` is this stage's part of the model. Stage 0 gets the ``num_micro`` micro-batches
    in ``micro_batches`` (None elsewhere); the last stage gets ``loss_fn(output, i)``, micro-batch
    ``i``'s mean loss (None elsewhere). Every activation sent from one stage to the next, and every
    gradient sent back, has shape ``shape`` and the dtype and device of ``module``'s parameters.

    What must hold when it returns: each parameter's ``.grad`` is what one process would get from
    the mean loss over the whole batch (the ``m`` micro-batches together); messages went only to
    the neighbour stages, with ``dist.isend``/``dist.irecv`` (or ``send``/``recv``,
    ``batch_isend_irecv``) and every send completed; the stage ran its forwards and backwards in
    1F1B's order, so that it never held more than ``min(num_stages - stage, num_micro)``
    micro-batches' activations at once; and no stage waited for a neighbour that was itself
    waiting. Returns the whole batch's mean loss (detached) on the last stage, None elsewhere.
    """
    first, last = stage == 0, stage == num_stages - 1
    like = next(module.parameters())
    inputs: dict[int, torch.Tensor] = {}
    outputs: dict[int, torch.Tensor] = {}
    sends: list = []
    total = torch.zeros((), dtype=like.dtype, device=like.device)

    def forward(i: int) -> None:
        if first:
            h = micro_batches[i]
        else:
            h = torch.empty(shape, dtype=like.dtype, device=like.device)
            dist.irecv(h, src=stage - 1).wait()
            h.requires_grad_()
        out = module(h)
        if last:
            out = loss_fn(out, i) / num_micro
        else:
            sends.append(dist.isend(out.detach(), dst=stage + 1))
        inputs[i], outputs[i] = h, out

    def backward(i: int) -> None:
        h, out = inputs.pop(i), outputs.pop(i)
        if last:
            out.backward()
            total.add_(out.detach())
        else:
            grad = torch.empty(shape, dtype=like.dtype, device=like.device)
            dist.irecv(grad, src=stage + 1).wait()
            out.backward(grad)
        if not first:
            sends.append(dist.isend(h.grad, dst=stage - 1))

    warmup = min(num_stages - 1 - stage, num_micro)
    for i in range(warmup):
        forward(i)
    for i in range(warmup, num_micro):
        forward(i)
        backward(i - warmup)
    for i in range(num_micro - warmup, num_micro):
        backward(i)
    for work in sends:
        work.wait()
    return total if last else None
