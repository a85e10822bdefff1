"""Lesson 13's exercise: algorithm and bus bandwidth, as nccl-tests reports them.

The reference factors are written here as fractions from nccl-tests' PERFORMANCE.md, not
taken from the solution; the last case times a real ``dist.all_reduce`` with
``busbw.measure_worker`` (the lesson's own measurement) and compares with
``busbw.bus_factor``.
"""

from __future__ import annotations

import math
from fractions import Fraction

from ddp_tutorial.comm.busbw import KB, bus_factor, measure_worker
from ddp_tutorial.exercises.exercise import Exercise
from ddp_tutorial.exercises.harness import Case, Report, load_function, run_cases
from ddp_tutorial.exercises.tracing import traced

# busbw / algbw, nccl-tests' PERFORMANCE.md, as exact fractions of n
NCCL_TESTS = {"all_reduce": lambda n: Fraction(2 * (n - 1), n), "all_gather": lambda n: Fraction(n - 1, n),
              "reduce_scatter": lambda n: Fraction(n - 1, n), "broadcast": lambda n: Fraction(1)}
WORLDS = (2, 4, 8, 1)
NBYTES, SECONDS = 3 * 10 ** 9, 0.5  # 6 GB/s of algorithm bandwidth: easy to see which factor was used


def close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


def explain(result: object, nbytes: int, seconds: float, n: int, collective: str) -> str | None:
    """None if ``result`` is nccl-tests' ``(algbw, busbw)``; else what is wrong with it."""
    if not (isinstance(result, tuple) and len(result) == 2
            and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in result)):
        return f"returned {result!r}, not a tuple (algbw, busbw) of two floats"
    algbw, busbw = float(result[0]), float(result[1])
    want_alg = nbytes / seconds / 1e9
    factor = NCCL_TESTS[collective](n)
    want_bus = want_alg * float(factor)
    call = f"bus_bandwidth({nbytes}, {seconds}, {n}, {collective!r})"
    if close(algbw, want_alg) and close(busbw, want_bus):
        return None
    if close(algbw, want_bus) and close(busbw, want_alg) and not close(want_alg, want_bus):
        return f"{call} returned (busbw, algbw), swapped: return (algbw, busbw)"
    if not close(algbw, want_alg):
        if close(algbw, nbytes / seconds / 2 ** 30):
            return (f"{call}: algbw is {algbw:.6g}, expected {want_alg:.6g} GB/s: that is GiB/s (2**30 bytes); "
                    "nccl-tests' GB are 10**9 bytes")
        if close(algbw, nbytes / seconds):
            return f"{call}: algbw is {algbw:.6g}, expected {want_alg:.6g}: in GB/s, divide bytes per second by 1e9"
        if close(algbw, seconds / nbytes / 1e9) or close(algbw, seconds / nbytes * 1e9):
            return f"{call}: algbw is {algbw:.6g}, expected {want_alg:.6g}: bytes over seconds, not seconds over bytes"
        return f"{call}: algbw is {algbw:.6g}, expected nbytes / seconds = {want_alg:.6g} GB/s"
    used = busbw / want_alg if want_alg else float("nan")
    named = {"2 (n - 1) / n, all-reduce's": float(Fraction(2 * (n - 1), n)), "(n - 1) / n": float(Fraction(n - 1, n)),
             "1": 1.0, "n": float(n), "(n - 1)": float(n - 1), "2": 2.0}
    which = next((name for name, f in named.items() if close(used, f)), None)
    got = f"the factor {which}" if which else f"a factor {used:.6g}"
    rule = {"all_reduce": "an all-reduce is a reduce-scatter then an all-gather: each rank's link carries "
                          "2 (n - 1) / n of the message",
            "all_gather": "each rank receives the n - 1 pieces it lacks: (n - 1) / n of the full output",
            "reduce_scatter": "each rank sends the n - 1 pieces it does not keep: (n - 1) / n of the full input",
            "broadcast": "a pipelined broadcast passes the whole message through every link once: factor 1, "
                         "whatever n is"}[collective]
    return (f"{call}: busbw is {busbw:.6g} GB/s, expected {want_bus:.6g} = algbw * {factor} (nccl-tests); "
            f"it used {got}: {rule}")


def bus_bandwidth_worker(rank: int, world_size: int, source: str, function: str, trace_dir: str) -> Report:
    """Every collective on worlds of 2, 4, 8 and 1 ranks, then a real timed ``dist.all_reduce`` on this world."""
    with traced(rank, trace_dir) as trace:
        fn = load_function(source, function)

        def table(collective: str) -> str | None:
            for n in WORLDS:
                wrong = explain(fn(NBYTES, SECONDS, n, collective), NBYTES, SECONDS, n, collective)
                if wrong:
                    return wrong
            return None

        def measured() -> str | None:
            row = measure_worker(rank, world_size, [64 * KB], repeat=1, max_calls=4)[0]
            result = fn(row["bytes"], row["dist_s"], world_size, "all_reduce")
            algbw = row["bytes"] / row["dist_s"] / 1e9
            if not (isinstance(result, tuple) and len(result) == 2):
                return explain(result, row["bytes"], row["dist_s"], world_size, "all_reduce")
            if close(float(result[0]), algbw) and close(float(result[1]), algbw * bus_factor(world_size)):
                return None
            return "on a timed dist.all_reduce row (busbw.measure_worker): " + str(
                explain(result, row["bytes"], row["dist_s"], world_size, "all_reduce"))

        cases: list[Case] = [(f"{c}, worlds of {', '.join(map(str, WORLDS))}", lambda c=c: table(c))
                             for c in NCCL_TESTS]
        cases.append(("a timed dist.all_reduce of 64 KB on this world", measured))
        return run_cases(trace, cases)


EXERCISES = [
    Exercise(
        name="bus_bandwidth", number="13.1", lesson=13, notebook="13_performance.ipynb",
        title="algorithm bandwidth and bus bandwidth", level="warm-up",
        task=("Turn one timed collective into nccl-tests' two numbers: algbw = bytes / seconds, and busbw, "
              "algbw times the share of the message each rank's link carries, for all_reduce, all_gather, "
              "reduce_scatter and broadcast."),
        hint=("Count what one rank sends in the ring versions: a reduce-scatter sends n - 1 chunks of "
              "nbytes / n, an all-gather too, an all-reduce both. A broadcast is the exception: factor 1. "
              "GB = 1e9 bytes."),
        checks=("the four collectives on worlds of 2, 4, 8 and 1 ranks, against nccl-tests' factors "
                "(PERFORMANCE.md) written as fractions; then a real dist.all_reduce timed by "
                "busbw.measure_worker, against busbw.bus_factor"),
        worker=bus_bandwidth_worker),
]
