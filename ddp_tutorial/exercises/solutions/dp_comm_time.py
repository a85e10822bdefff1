"""Exercise 23.2, reference solution: the seconds a data-parallel step spends all-reducing its gradients.

The alpha-beta model of lesson 06: a message of ``m`` bytes sent as one ring step costs
``alpha + m / beta``. A ring all-reduce over ``n`` ranks is a reduce-scatter then an all-gather,
``n - 1`` steps each, and in every step each rank sends one ``n``-th of the tensor: ``2 (n - 1)``
latencies and ``2 (n - 1) / n`` of the tensor per rank. Each bucket is its own all-reduce, so
the latency is paid once per bucket, while the bytes add up to the whole gradient whatever the
bucket size. The gradient holds ``params`` values of the stated dtype (2 bytes in bf16 or fp16, 4
in fp32), and a link sold at ``G`` Gb/s moves ``G * 1e9 / 8`` bytes per second. One rank sends
nothing.
"""

from __future__ import annotations

BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}


def dp_comm_time(params: int, grad_dtype: str, ranks: int, *, buckets: int, link_gbps: float,
                 latency_s: float) -> float:
    """Return the seconds the step's gradient all-reduces take, end to end, on each rank.

    ``params`` gradients of dtype ``grad_dtype`` (``"bf16"``, ``"fp16"`` or ``"fp32"``) are
    all-reduced over ``ranks`` ranks in ``buckets`` buckets of equal size, one after another,
    each with a ring all-reduce (no overlap with the backward: the step waits for all of them).
    Each rank's link moves ``link_gbps`` gigabits per second (10**9 bits) each way, and each
    message sent pays ``latency_s`` seconds first (lesson 06's alpha-beta model). Pure arithmetic.
    """
    if ranks == 1:
        return 0.0
    nbytes = params * BYTES[grad_dtype]
    bandwidth = link_gbps * 1e9 / 8  # bytes per second
    steps = 2 * (ranks - 1)  # reduce-scatter, then all-gather
    per_bucket = steps * (latency_s + nbytes / buckets / ranks / bandwidth)
    return buckets * per_bucket
