"""Exercise 23.7, reference solution: the TP degree past which a layer is communication-bound.

23.6's ratio grows with ``t``: the compute per GPU falls as ``1 / t`` while the ring's bytes per GPU
approach twice the activations and its latencies grow as ``2 (t - 1)``. So the answer is the last
``t`` before the ratio passes 1. Megatron splits the attention heads over the ``t`` GPUs: ``t`` must
divide them. And one node of 8 GPUs bounds ``t``: past it the all-reduces would leave NVLink.
"""

from __future__ import annotations


def tp_limit(dim: int, seq: int, heads: int, *, micro_batch: int, layer_params: int, matmul_flops: float,
             link_bytes_per_s: float, latency_s: float) -> int:
    """Return the largest TP degree t for which the layer's TP traffic takes at most its compute.

    The layer, the microbatch and the hardware are 23.6's (``tp_comm_to_compute``: the same
    arguments, the same rule); ``heads`` attention heads. Try t = 1 to 8 (one node: TP stays on its
    NVLink), only those that divide ``heads``; return the largest whose traffic seconds are at most
    its compute seconds (t = 1, with no traffic, always is). Pure arithmetic.
    """
    tokens = micro_batch * seq
    best = 1
    for t in range(2, 9):
        if heads % t:
            continue
        compute = (6 * layer_params + 12 * seq * dim) * tokens / t / matmul_flops
        bytes_sent = 2 * (t - 1) / t * 2 * tokens * dim
        traffic = 4 * (2 * (t - 1) * latency_s + bytes_sent / link_bytes_per_s)
        if traffic <= compute:
            best = t
    return best
