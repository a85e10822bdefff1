"""How the course times code: the best of several runs (``01_data_parallel``, ``bench``).

A neutral home for the timer that lessons and benchmarks share, so that a lesson
never imports the benchmark package. Why the best and not the mean: on a laptop
or a shared 2-core VM other programs take the cores now and then, and every such
interruption only ever adds time. The fastest run is the one least disturbed, so
it is the most repeatable number; the mean mostly measures the neighbours.
"""

from __future__ import annotations

import time
from typing import Any, Callable

__all__ = ["timed"]


def timed(fn: Callable[[], Any], repeat: int = 5, warmup: int = 1) -> float:
    """Best wall time of ``repeat`` calls of ``fn`` after ``warmup`` untimed calls, in seconds.

    The warm-up calls pay the one-time costs (allocations, lazy imports, caches).
    ``fn`` must finish its work before it returns: on a GPU, synchronize inside it.
    """
    for _ in range(warmup):
        fn()
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best
