"""Exercise 23.2 (medium), lesson 23_how_fast.ipynb: a data-parallel step's gradient all-reduce time, alpha-beta.

Write dp_comm_time() below (its docstring is the contract: what must hold), then check it:
    check("dp_comm_time")                                 in the notebook
    python -m ddp_tutorial.exercises check dp_comm_time   from a shell
The checker's ranks read this file afresh each time: an edit counts at once.
Hints, one at a time: python -m ddp_tutorial.exercises show dp_comm_time [--hint 2 .. 3]
Start again from the stub: python -m ddp_tutorial.exercises reset dp_comm_time
"""

from __future__ import annotations


def dp_comm_time(params: int, grad_dtype: str, ranks: int, *, buckets: int, link_gbps: float,
                 latency_s: float) -> float:
    """Return the seconds the step's gradient all-reduces take, end to end, on each rank.

    ``params`` gradients of dtype ``grad_dtype`` (``"bf16"``, ``"fp16"`` or ``"fp32"``) are
    all-reduced over ``ranks`` ranks in ``buckets`` buckets of equal size, one after another,
    each with a ring all-reduce (no overlap with the backward: the step waits for all of them).
    Each rank's link moves ``link_gbps`` gigabits per second (10**9 bits) each way, and each
    message sent pays ``latency_s`` seconds first (lesson 06's alpha-beta model). Pure arithmetic.
    """
    # Your code here; the checker calls dp_comm_time(params, grad_dtype, ranks, buckets, link_gbps, latency_s) on every rank.
    raise NotImplementedError(
        'exercise 23.2 (dp_comm_time): not started yet, as expected for a fresh stub: '
        'my_exercises/dp_comm_time.py still raises NotImplementedError. Next: write dp_comm_time() '
        'there (its docstring is the contract, lesson 23_how_fast.ipynb explains it, '
        "show('dp_comm_time') gives hints), then check again")
