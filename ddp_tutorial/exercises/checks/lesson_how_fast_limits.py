"""Lesson 23's problems at GPU scale with exact answers: the largest model a layout fits (23.5), a
Megatron layer's TP traffic over its compute (23.6) and the TP degree past which it is
communication-bound on NVLink (23.7; their cases, references and workers in ``tp_bound``).

23.5's reference, written out here (the tests hold it against ``sharding.calculator``): mixed-precision
Adam holds 2 + 2 + 12 bytes per parameter (bf16 weights and gradients; fp32 master, m and v), each
GPU ``1 / (tp pp)`` of them, and ZeRO stage 1, 2, 3 divides the optimizer states, then the gradients,
then the weights by the data-parallel degree ``gpus / (tp pp)``. The answer is the floor of the
budget over the bytes per parameter, computed in fractions; every case keeps that quotient at least
0.01 from a whole number, so float arithmetic gives the same floor. A wrong count is explained by
the fewest typical mistakes that give it (``estimates.fewest_mistakes``).
"""

from __future__ import annotations

import math
import numbers
from fractions import Fraction

from ddp_tutorial.exercises.checks.estimates import Knobs, fewest_mistakes, not_a_number
from ddp_tutorial.exercises.checks.tp_bound import TP_EXERCISES
from ddp_tutorial.exercises.exercise import Exercise
from ddp_tutorial.exercises.harness import Case, Report, load_function, run_cases
from ddp_tutorial.exercises.tracing import traced

REFUSED = ("ddp_tutorial.performance", "ddp_tutorial.sharding.calculator")
GIB = 2 ** 30
# (label, GiB per GPU, GiB kept for activations and buffers, GPUs, tp, pp, ZeRO stage)
FIT_CASES = [
    ("64 H100s of 79.1 GiB, 20 GiB kept back, tp 4 x pp 2 x dp 8, ZeRO-1", 79.1, 20, 64, 4, 2, 1),
    ("16 A100s of 39.4 GiB, 8 GiB kept back, tp 2 x dp 8, ZeRO-2", 39.4, 8, 16, 2, 1, 2),
    ("1,024 H200s of 139.8 GiB, 40 GiB kept back, tp 8 x pp 4 x dp 32, ZeRO-3", 139.8, 40, 1024, 8, 4, 3),
    ("48 H100s of 79.1 GiB, 12 GiB kept back, tp 8 x pp 2 x dp 3, no ZeRO (DDP)", 79.1, 12, 48, 8, 2, 0),
]
# bytes per parameter (bf16 weights, gradients, optimizer states), the right one first
STATES = [((2, 2, 12), None),
          ((2, 0, 0), "2 bytes per parameter, the bf16 weights alone: training also holds the gradients (2 bytes) "
                      "and Adam's fp32 master weights, m and v (12): 16 in all"),
          ((4, 0, 0), "4 bytes per parameter, as if fp32 weights were all: mixed-precision Adam holds 2 + 2 + 12 "
                      "= 16 (bf16 weights and gradients; fp32 master, m and v)"),
          ((0, 0, 12), "12 bytes per parameter, the optimizer states alone: the bf16 weights and gradients add "
                       "2 + 2, 16 in all")]


def per_parameter(*, gpus: int, tp: int, pp: int, zero: int) -> Fraction:
    """Bytes one GPU holds per parameter of the model: 16 split by tp x pp, ZeRO's shares over dp."""
    dp = gpus // (tp * pp)

    def share(stage: int) -> Fraction:
        return Fraction(1, dp) if zero >= stage else Fraction(1)

    return Fraction(1, tp * pp) * (2 * share(3) + 2 * share(2) + 12 * share(1))


def most_params(memory_gib: float, reserve_gib: float, *, gpus: int, tp: int, pp: int, zero: int) -> Fraction:
    """The budget over the bytes per parameter, exactly (its floor is the answer)."""
    budget = (Fraction(memory_gib) - Fraction(reserve_gib)) * GIB
    return budget / per_parameter(gpus=gpus, tp=tp, pp=pp, zero=zero)


def fit_knobs(gpus: int, tp: int, pp: int, zero: int) -> Knobs:
    """Each term of the count: the right choice first, then the typical mistakes."""
    dp, names = gpus // (tp * pp), {1: "the optimizer states", 2: "+ the gradients", 3: "+ the weights"}
    more = {1: "the gradients", 2: "the weights"}
    return {
        "states": [(words, i) for i, (_, words) in enumerate(STATES)],
        "stage": [(None, zero)]
        + [(f"ZeRO-{zero} sharding {more[zero]} too: stage 1 shards the optimizer states, 2 the gradients as "
            "well, 3 the weights as well", zero + 1)] * (zero in more)
        + [(f"ZeRO-{zero}'s sharding left out: it divides {names[zero]} by the {dp} data-parallel ranks", 0)]
        * (zero > 0),
        "shard": [(None, dp)] + [(f"ZeRO sharded over all {gpus} GPUs: it shards over the data-parallel group, "
                                  f"gpus / (tp x pp) = {dp} ranks (the tp x pp GPUs of one replica hold different "
                                  "parts of the model, not copies)", gpus)] * (zero > 0 and dp != gpus),
        "split": [(None, tp * pp)]
        + [("tensor and pipeline parallelism forgotten: each GPU holds 1 / (tp x pp) of the model", 1)] * (tp * pp > 1)
        + [(f"the pipeline's split forgotten: each of the pp = {pp} stages holds 1 / pp of the layers", tp)] * (pp > 1)
        + [(f"the tensor-parallel split forgotten: each of the tp = {tp} ranks holds 1 / tp of every "
            "layer", pp)] * (tp > 1),
        "unit": [(None, GIB), ("GB (10**9 bytes) for GiB: a GiB is 2**30 = 1,073,741,824 bytes", 10 ** 9)],
        "reserve": [(None, 1), ("the reserve left out: reserve_gib is not for the model's states", 0)],
        "rounding": [(None, 0), ("rounded to the nearest: one parameter more would not fit; the largest N that "
                                 "fits is the quotient rounded down", 1)],
    }


def params_for(memory_gib: float, reserve_gib: float, k: dict) -> float:
    """The count one choice of every term gives."""
    (w, g, o), _ = STATES[k["states"]]
    per = Fraction(1, k["split"]) * sum(b * (Fraction(1, k["shard"]) if k["stage"] >= stage else 1)
                                        for b, stage in ((w, 3), (g, 2), (o, 1)))
    quotient = (Fraction(memory_gib) - k["reserve"] * Fraction(reserve_gib)) * k["unit"] / per
    return float(round(quotient) if k["rounding"] else math.floor(quotient))


def wrong_fit(got: object, call: str, memory_gib: float, reserve_gib: float, *, gpus: int, tp: int, pp: int,
              zero: int) -> str | None:
    """None if ``got`` is the largest count that fits; else the mistakes that give it."""
    wrong = not_a_number(got)
    if wrong:
        return f"{call} {wrong}"
    exact = most_params(memory_gib, reserve_gib, gpus=gpus, tp=tp, pp=pp, zero=zero)
    want = math.floor(exact)
    if not (isinstance(got, numbers.Integral) or float(got).is_integer()):
        if math.isclose(got, exact, rel_tol=1e-9):
            return f"{call} returned {got:,.2f}, the quotient itself: round it down, to {want:,}, the largest whole N"
        return f"{call} returned {got:,.2f}, a fraction of a parameter: return a whole number, the largest N that fits"
    if int(got) == want:
        return None
    mistakes = fewest_mistakes(float(got), fit_knobs(gpus, tp, pp, zero), lambda k: params_for(memory_gib,
                                                                                               reserve_gib, k),
                               rel=1e-15)
    per = per_parameter(gpus=gpus, tp=tp, pp=pp, zero=zero)
    head = f"{call} returned {int(got):,}, expected {want:,}"
    if mistakes:
        return f"{head}: " + "; and ".join(mistakes)
    return (f"{head}; no typical mistake gives that number: {memory_gib - reserve_gib:g} GiB x 2**30 bytes over "
            f"{float(per):.6g} bytes per parameter on each GPU (16 bytes, split by tp x pp, ZeRO-{zero}'s shares "
            f"over dp = {gpus // (tp * pp)}), rounded down")


def largest_model_worker(rank: int, world_size: int, source: str, function: str, trace_dir: str) -> Report:
    """Each case of ``FIT_CASES``: the learner's count against the reference, else the mistakes."""
    with traced(rank, trace_dir) as trace:
        fn = load_function(source, function, refuse=REFUSED)

        def case(memory_gib: float, reserve_gib: float, gpus: int, tp: int, pp: int, zero: int) -> str | None:
            call = f"largest_model({memory_gib}, {reserve_gib}, {gpus}, tp={tp}, pp={pp}, zero={zero})"
            got = fn(memory_gib, reserve_gib, gpus, tp=tp, pp=pp, zero=zero)
            return wrong_fit(got, call, memory_gib, reserve_gib, gpus=gpus, tp=tp, pp=pp, zero=zero)

        cases: list[Case] = [(label, lambda a=args: case(*a)) for label, *args in FIT_CASES]
        return run_cases(trace, cases)


EXERCISES = [
    Exercise(
        name="largest_model", number="23.5", lesson=23, notebook="23_how_fast.ipynb",
        title="the largest model whose training states fit a layout", level="medium",
        task=("Return the largest parameter count N whose mixed-precision Adam states (bf16 weights and "
              "gradients, fp32 master weights, m and v) fit each GPU's memory less a reserve, when the GPUs are "
              "split tp x pp x dp and ZeRO stage 0-3 shards over the data-parallel ranks. An exact integer."),
        hint=("Count the bytes ONE GPU holds per parameter of the model: how many bytes each parameter has in "
              "all, which share of the model a GPU holds under tp and pp, and which of the three states ZeRO's "
              "stage divides, by how many ranks. Then the memory in bytes over that, rounded down."),
        more_hints=("16 bytes per parameter: 2 (bf16 weights) + 2 (bf16 gradients) + 12 (fp32 master, m, v). "
                    "tp x pp divides all of them. dp = gpus / (tp x pp): ZeRO-1 divides the 12 by dp, ZeRO-2 "
                    "the gradients' 2 as well, ZeRO-3 the weights' 2 as well. A GiB is 2**30 bytes.",
                    "dp = gpus // (tp * pp); per_gpu = (2 / (dp if zero >= 3 else 1) + 2 / (dp if zero >= 2 "
                    "else 1) + 12 / (dp if zero >= 1 else 1)) / (tp * pp); return math.floor((memory_gib - "
                    "reserve_gib) * 2**30 / per_gpu)."),
        checks=("four layouts in one process, from 16 A100s to 1,024 H200s, ZeRO 0 to 3: the exact floor, against "
                "the rule written out in the checker (its bytes per GPU held against sharding.calculator in the "
                "tests); a wrong count is explained by the typical mistakes that give it (ZeRO over all GPUs, "
                "a stage sharding too much, 2, 4 or 12 bytes for 16, GB for GiB, tp or pp forgotten, the reserve "
                "left out, rounding up); ddp_tutorial.performance and ddp_tutorial.sharding.calculator are refused"),
        worker=largest_model_worker, world_sizes=(1,), init_process_group=False),
    *TP_EXERCISES,
]
