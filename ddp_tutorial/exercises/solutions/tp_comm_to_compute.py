"""Exercise 23.6, reference solution: a Megatron layer's TP traffic over its compute.

Compute: a layer's forward costs 2 FLOPs per weight per token and attention's ``Q K^T`` and ``P V``
``4 s h`` per token; the backward twice that: ``(6 P + 12 s h)`` per token, on ``b s`` tokens, and
each of the ``t`` GPUs does ``1 / t`` of it. Traffic (Megatron, Shoeybi et al. 2019): the forward
all-reduces the activations after attention and after the MLP, the backward the gradients of their
inputs, four all-reduces of ``b s h`` bf16 values per layer. A ring all-reduce over ``t`` GPUs is
``2 (t - 1)`` steps, each paying the latency, in which each GPU sends ``2 (t - 1) / t`` of the
tensor. Nothing hides it: the next matmul needs the result.
"""

from __future__ import annotations


def tp_comm_to_compute(t: int, dim: int, seq: int, *, micro_batch: int, layer_params: int,
                       matmul_flops: float, link_bytes_per_s: float, latency_s: float) -> float:
    """Return the seconds of one layer's TP all-reduces over the seconds of its compute, on one GPU.

    One transformer layer (``layer_params`` weights that multiply, hidden size ``dim``) is split
    over ``t`` GPUs of one node with Megatron's tensor parallelism (no sequence parallelism), and
    runs the forward and the backward of one microbatch of ``micro_batch`` sequences of ``seq``
    tokens, activations in bf16, nothing recomputed. Compute: the layer's model FLOPs (its weights'
    and attention's scores over the whole ``seq x seq`` square, as 23.1 counts them) at
    ``matmul_flops`` FLOP/s. Traffic: the step model's rule (``stepmodel.tp_seconds``): ring
    all-reduces over the ``t`` GPUs on a link of ``link_bytes_per_s`` bytes per second each way,
    each ring step paying ``latency_s``, none hidden behind the compute. 0 at ``t = 1``.
    Pure arithmetic.
    """
    tokens = micro_batch * seq
    compute = (6 * layer_params + 12 * seq * dim) * tokens / t / matmul_flops
    activations = 2 * tokens * dim  # bytes: b s h values of bf16
    all_reduce = 2 * (t - 1) * latency_s + 2 * (t - 1) / t * activations / link_bytes_per_s
    return 4 * all_reduce / compute  # two all-reduces forward, two backward
