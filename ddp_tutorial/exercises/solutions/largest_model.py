"""Exercise 23.5, reference solution: the largest model whose training states fit a layout.

Mixed-precision Adam (the ZeRO paper's layout, lesson 17) holds 16 bytes per parameter: 2 for the
bf16 weights, 2 for the bf16 gradients, 12 for the fp32 master weights and Adam's m and v. Tensor
and pipeline parallelism split all of them: a GPU holds ``1 / (tp pp)`` of the model. The remaining
factor of the GPUs, ``dp = gpus / (tp pp)``, holds copies, and ZeRO shards the copies over those dp
ranks only: stage 1 the optimizer states, stage 2 the gradients as well, stage 3 the weights as
well. The budget is the memory less the reserve, in bytes (a GiB is 2**30 of them); the largest N
is that budget over the bytes per parameter, rounded down.
"""

from __future__ import annotations

import math


def largest_model(memory_gib: float, reserve_gib: float, gpus: int, *, tp: int, pp: int, zero: int) -> int:
    """Return the largest parameter count N (an int) whose training states fit every GPU.

    ``gpus`` GPUs of ``memory_gib`` GiB each (2**30 bytes, as torch and the course's calculator print
    it) train an N-parameter model with mixed-precision Adam: bf16 weights and gradients, fp32 master
    weights, m and v. ``reserve_gib`` of each GPU is kept for activations, buffers and the CUDA
    context; the states must fit in the rest. The GPUs are split ``tp`` x ``pp`` x dp (``gpus`` is a
    multiple of ``tp * pp``): tensor and pipeline parallelism divide the model evenly (embeddings and
    norms included: assume every tensor splits), and ZeRO stage ``zero`` (0: plain data parallelism,
    1, 2 or 3) shards over the data-parallel ranks. Shares are exact fractions (no rounding up to
    whole parameters per rank); the largest N whose states fit (at most the budget) is the answer.
    Pure arithmetic.
    """
    dp = gpus // (tp * pp)
    weights = 2 / (dp if zero >= 3 else 1)
    grads = 2 / (dp if zero >= 2 else 1)
    optimizer = 12 / (dp if zero >= 1 else 1)
    per_parameter = (weights + grads + optimizer) / (tp * pp)  # bytes on one GPU per parameter of the model
    return math.floor((memory_gib - reserve_gib) * 2 ** 30 / per_parameter)
