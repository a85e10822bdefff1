"""Exercise 13.1, reference solution: algorithm bandwidth and bus bandwidth, as nccl-tests defines them.

The algorithm bandwidth is the message size over the time: ``algbw = nbytes / seconds``.
It depends on the world size even when every link runs at full speed, because a bigger
world makes each rank send more. The bus bandwidth corrects for that: it is what one
rank's link carried, ``busbw = algbw * factor``, with nccl-tests' factors. An all-reduce
(reduce-scatter, then all-gather) moves ``2 (n - 1) / n`` of the message through every
rank; an all-gather or a reduce-scatter alone ``(n - 1) / n`` of the full tensor (the
all-gather's output, the reduce-scatter's input); a broadcast, pipelined, the whole
message once: factor 1. With one rank nothing travels and the factor of the first three
is 0. Gigabytes are 10**9 bytes, as nccl-tests prints them.
"""

from __future__ import annotations

FACTORS = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
           "reduce_scatter": lambda n: (n - 1) / n, "broadcast": lambda n: 1.0}


def bus_bandwidth(nbytes: int, seconds: float, world_size: int, collective: str) -> tuple[float, float]:
    """Return ``(algbw, busbw)`` in GB/s (10**9 bytes per second) for one timed collective.

    ``nbytes`` is the size of the full tensor (an all-gather's output, a reduce-scatter's
    input, the all-reduced or broadcast tensor), ``seconds`` the time one call took on
    ``world_size`` ranks, ``collective`` one of ``"all_reduce"``, ``"all_gather"``,
    ``"reduce_scatter"``, ``"broadcast"``. ``algbw = nbytes / seconds``; ``busbw`` is
    ``algbw`` times the share of the message each rank's link carries (nccl-tests'
    PERFORMANCE.md): ``2 (n - 1) / n`` for all-reduce, ``(n - 1) / n`` for all-gather and
    reduce-scatter, ``1`` for broadcast. Pure arithmetic: no collective is called.
    """
    algbw = nbytes / seconds / 1e9
    return algbw, algbw * FACTORS[collective](world_size)
