"""Exercise 13.1 (warm-up), lesson 13_performance.ipynb: algorithm bandwidth and bus bandwidth.

Write bus_bandwidth() below (its docstring is the contract: what must hold), then check it:
    check("bus_bandwidth")                                 in the notebook
    python -m ddp_tutorial.exercises check bus_bandwidth   from a shell
The checker's ranks read this file afresh each time: an edit counts at once.
A hint: python -m ddp_tutorial.exercises show bus_bandwidth
Start again from the stub: python -m ddp_tutorial.exercises reset bus_bandwidth
"""

from __future__ import annotations


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
    # Your code here; the checker calls bus_bandwidth(nbytes, seconds, world_size, collective) on every rank.
    raise NotImplementedError(
        'exercise 13.1 (bus_bandwidth): not started yet, as expected for a fresh stub: '
        'my_exercises/bus_bandwidth.py still raises NotImplementedError. Next: write '
        'bus_bandwidth() there (its docstring is the contract, lesson 13_performance.ipynb explains'
        " it, show('bus_bandwidth') gives hints), then check again")
