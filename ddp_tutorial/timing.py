"""How the course times code: the best of several runs (``01_data_parallel``, ``08_ddp_from_scratch``, ``bench``).

A neutral home for the timer that lessons and benchmarks share, so that a lesson
never imports the benchmark package. Why the best and not the mean: on a laptop
or a shared 2-core VM other programs take the cores now and then, and every such
interruption only ever adds time. The fastest run is the one least disturbed, so
it is the most repeatable number; the mean mostly measures the neighbours.
``take_turns`` compares several steps on several ranks: they run round by round, so
that such interruptions hit all of them alike.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["timed", "take_turns"]


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


def take_turns(steppers: dict, steps: int, repeat: int, device: torch.device) -> dict[str, dict[str, float]]:
    """Time single steps of each stepper, taking turns round by round so that noise from other
    programs hits them alike; ``best`` (the least disturbed step) and ``median`` seconds."""
    seen: dict = {k: [] for k in steppers}
    for round_ in range(repeat + 1):  # round 0 warms up
        for k, step in steppers.items():
            dist.barrier()
            for _ in range(steps):
                start = time.perf_counter()
                step()
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                if round_:
                    seen[k].append(time.perf_counter() - start)
    return {k: {"best": min(v), "median": sorted(v)[len(v) // 2]} for k, v in seen.items()}
