"""Lesson 23's checks of an estimate: which typical mistakes give the learner's number (and 23.2's cases).

An estimate is one number, so a wrong one says little by itself; but each public mistake scales
one term by a known factor. ``fewest_mistakes`` tries every combination of the right choice and
the typical wrong ones for each term (``Knobs``: a term's options, each ``(mistake in words or
None, value)``), and returns the fewest mistakes whose formula gives the learner's number. The
cases are built so that no two mistakes give the same number. 23.2's reference, written out
here, is the ring all-reduce's ``2 (n - 1) / n`` bytes and ``2 (n - 1)`` latencies per bucket.
"""

from __future__ import annotations

import itertools
import math
import numbers
from collections.abc import Callable

from ddp_tutorial.exercises.harness import Case, Report, load_function, run_cases
from ddp_tutorial.exercises.tracing import traced

Knobs = dict[str, list[tuple["str | None", float]]]


def fewest_mistakes(got: float, knobs: Knobs, formula: Callable[[dict[str, float]], float], *,
                    rel: float) -> list[str] | None:
    """The fewest mistakes (in ``knobs``' words) whose ``formula`` gives ``got``; [] if none are needed,
    None if no combination does."""
    best: list[str] | None = None
    names = list(knobs)
    for choice in itertools.product(*knobs.values()):
        mistakes = [m for m, _ in choice if m]
        if best is not None and len(mistakes) >= len(best):
            continue
        if math.isclose(formula(dict(zip(names, (v for _, v in choice)))), got, rel_tol=rel, abs_tol=1e-300):
            best = mistakes
    return best


def not_a_number(result: object) -> str | None:
    """What is wrong with ``result`` as an estimate (None: a finite real number)."""
    if isinstance(result, bool) or not isinstance(result, numbers.Real):
        return f"returned {type(result).__name__} {result!r}, not a number (a float)"
    if not math.isfinite(result):
        return f"returned {result}, not a finite number"
    return None


def verdict(call: str, got: float, want: float, mistakes: list[str] | None, formula: str) -> str:
    """The failure message: the numbers, and the mistakes that explain them (or the formula's parts)."""
    head = f"{call} returned {got:.6g}, expected {want:.6g}"
    if mistakes:
        return f"{head}: " + "; and ".join(mistakes)
    return f"{head}; no typical mistake gives that number: {formula}"


# (label, params, grad dtype, ranks, buckets, link Gb/s, latency s); no world of 8 (the bits' 8 would equal n)
COMM_CASES = [
    ("8B parameters in bf16 over 16 ranks, 640 buckets, a 400 Gb/s network, alpha 6 us (bandwidth-bound)",
     8.03e9, "bf16", 16, 640, 400.0, 6e-6),
    ("10M parameters in fp32 over 64 ranks, 40 buckets, 100 Gb/s, alpha 20 us (latency-bound)",
     1.0e7, "fp32", 64, 40, 100.0, 20e-6),
    ("1.3B parameters in fp16 over 3 ranks, 52 buckets, NVLink's 3600 Gb/s (450 GB/s), alpha 3 us",
     1.3e9, "fp16", 3, 52, 3600.0, 3e-6),
    ("1B parameters in bf16 on 1 rank, 40 buckets, 400 Gb/s, alpha 6 us (nothing to send)",
     1.0e9, "bf16", 1, 40, 400.0, 6e-6),
]
SIZE = {"bf16": 2, "fp16": 2, "fp32": 4}


def comm_knobs(dtype: str, n: int, buckets: int, gbps: float) -> Knobs:
    """Each term of the all-reduce time: the right choice first, then the typical mistakes."""
    return {
        "bytes": [(None, SIZE[dtype])] + [(f"the gradients counted in fp32, 4 bytes a value: they are {dtype}, "
                                           f"{SIZE[dtype]} bytes", 4)] * (SIZE[dtype] != 4),
        "share": [(None, 2 * (n - 1) / n),
                  ("the bytes of a reduce-scatter alone, (n - 1) / n of the gradients: an all-reduce is a "
                   "reduce-scatter then an all-gather, the factor 2 of 2 (n - 1) / n", (n - 1) / n),
                   ("each rank sends 2 x the gradients, the (n - 1) / n left out: a rank keeps its own 1/n "
                    "chunk, so it sends 2 (n - 1) / n of them", 2.0),
                   ("each rank sends the gradients once: a ring all-reduce sends 2 (n - 1) / n of them", 1.0),
                   ("each of the 2 (n - 1) ring steps sends the whole gradient: a step sends one n-th chunk, "
                    "2 (n - 1) / n in all", 2.0 * (n - 1))],
        "hops": [(None, 2 * (n - 1)), ("n - 1 latencies per all-reduce: its 2 (n - 1) ring steps pay alpha "
                                       "each (reduce-scatter, then all-gather)", n - 1),
                 ("the latency left out: each of the 2 (n - 1) ring steps of every bucket pays alpha", 0),
                 ("one latency per bucket: a ring all-reduce pays alpha at each of its 2 (n - 1) steps", 1)],
        "latencies": [(None, buckets), ("the latency paid once per step, not once per bucket: each bucket is "
                                        "an all-reduce of its own, with its 2 (n - 1) latencies", 1)],
        "bucket": [(None, 1.0), ("every bucket counted with the whole gradient: the buckets split it, "
                                 "1/B each", buckets)],
        "bandwidth": [(None, gbps * 1e9 / 8), ("Gb/s read as GB/s: the link moves gigabits, 8 bits a byte, "
                                               "so link_gbps * 1e9 / 8 bytes per second", gbps * 1e9),
                      ("bits multiplied by 8 instead of divided: link_gbps * 1e9 / 8 bytes per second",
                       gbps * 1e9 * 8)],
        "unit": [(None, 1.0), ("in milliseconds: return seconds", 1e3), ("in microseconds: return seconds", 1e6)],
    }


def comm_seconds(params: float, k: dict[str, float]) -> float:
    """The time for one choice of every term: latencies plus bytes over bandwidth."""
    latency_part = k["latencies"] * k["hops"] * k["alpha"]
    return k["unit"] * (latency_part + k["share"] * params * k["bytes"] * k["bucket"] / k["bandwidth"])


def dp_comm_time_worker(rank: int, world_size: int, source: str, function: str, trace_dir: str) -> Report:
    """Each case of ``COMM_CASES``: the learner's seconds against the alpha-beta ring, else the mistakes."""
    with traced(rank, trace_dir) as trace:
        fn = load_function(source, function, refuse=("ddp_tutorial.performance.stepmodel",))

        def case(params: float, dtype: str, n: int, buckets: int, gbps: float, alpha: float) -> str | None:
            call = (f"dp_comm_time({params:.4g}, {dtype!r}, {n}, buckets={buckets}, link_gbps={gbps}, "
                    f"latency_s={alpha})")
            got = fn(int(params), dtype, n, buckets=buckets, link_gbps=gbps, latency_s=alpha)
            wrong = not_a_number(got)
            if wrong:
                return f"{call} {wrong}"
            latency_part = buckets * 2 * (n - 1) * alpha
            bytes_part = 2 * (n - 1) / n * params * SIZE[dtype] / (gbps * 1e9 / 8)
            want = latency_part + bytes_part
            if math.isclose(got, want, rel_tol=1e-6, abs_tol=1e-15):
                return None
            if n == 1:
                return f"{call} returned {got:.6g}: one rank has nobody to send to, the all-reduce costs 0 s"
            knobs = comm_knobs(dtype, n, buckets, gbps) | {"alpha": [(None, alpha)]}
            mistakes = fewest_mistakes(got, knobs, lambda k: comm_seconds(params, k), rel=1e-6)
            return verdict(call, got, want, mistakes,
                           f"{buckets} buckets x 2 (n - 1) = {2 * buckets * (n - 1)} latencies = {latency_part:.6g} s, "
                           f"plus 2 (n - 1) / n of the gradient's bytes over the link = {bytes_part:.6g} s")

        cases: list[Case] = [(label, lambda a=args: case(*a)) for label, *args in COMM_CASES]
        return run_cases(trace, cases)
