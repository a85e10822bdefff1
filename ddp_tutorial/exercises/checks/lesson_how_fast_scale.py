"""Lesson 23's exercises 23.3 and 23.4: predict a DDP step, then run it; days to train a model on a cluster.

23.3's reference is counted from a run, not computed from a formula: ``counted_step.count_step``
runs each case's step under DDP on the checker's gloo ranks and counts its FLOPs
(``FlopCounterMode``) and the gradient bytes handed to the all-reduce; the bytes a rank sends are
the ring's ``2 (n - 1) / n`` of that buffer, the seconds the stub's stated rule (no overlap)
applied to the counted figures. 23.4's reference goes through ``performance.flops.mfu``: the MFU
of the job's ``6 N D`` FLOPs in one second, over the MFU asked for, is the seconds. Each diagnosis
applies the typical mistakes to the reference and names the one the learner's number matches.
"""

from __future__ import annotations

import math
from itertools import combinations

from ddp_tutorial.exercises.checks.counted_step import Counted, count_step
from ddp_tutorial.exercises.exercise import Exercise
from ddp_tutorial.exercises.harness import Case, Report, load_function, run_cases
from ddp_tutorial.exercises.tracing import traced
from ddp_tutorial.performance.flops import mfu as model_flops_utilisation

REFUSED = ("ddp_tutorial.performance",)  # linear_flops, ring_bytes, collective_seconds: the answers
# (linear sizes, global batch rows, matmul FLOP/s, link bytes/s, latency s per ring step); batches split by 2 and 3
STEP_CASES = [([(16, 32), (32, 8)], 12, 2.0e9, 1.25e8, 7e-6),
              ([(24, 48), (48, 48), (48, 10)], 36, 5.0e9, 4.0e8, 3e-5),
              ([(8, 96), (96, 96), (96, 96), (96, 4)], 30, 1.0e10, 1.0e9, 2e-6),
              ([(64, 16)], 6, 3.0e9, 2.5e8, 1e-5)]


def close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=0.0)


def first_match(got: float, want: float, mistakes: list[tuple[str, float]]) -> str | None:
    """The first mistake whose number ``got`` is (one that gives the right number too is skipped)."""
    return next((what for what, value in mistakes if close(got, value) and not close(value, want)), None)


def wrong_prediction(result: object, c: Counted, sizes: list[tuple[int, int]], batch: int, n: int,
                     figures: tuple[float, float, float]) -> str | None:
    """None if ``result`` is the counted step's flops, bytes and seconds; else the term that is off."""
    rate, link, latency = figures
    call = f"predict_step({sizes}, {batch}, {n}, matmul_flops={rate:g}, link_bytes_per_s={link:g}, latency_s={latency:g})"
    if not (isinstance(result, dict) and {"flops", "bytes", "seconds"} <= set(result)
            and all(isinstance(result[k], (int, float)) and not isinstance(result[k], bool)
                    for k in ("flops", "bytes", "seconds"))):
        return f"{call} returned {result!r}: return a dict of three numbers, 'flops', 'bytes' and 'seconds'"
    flops, sent, seconds = (float(result[k]) for k in ("flops", "bytes", "seconds"))
    rows, (i0, o0) = batch // n, sizes[0]
    if flops != c.flops:
        said = first_match(flops, c.flops, [
            ("the forward alone: the backward's 2x is missing (a step is 6 FLOPs per weight per row, not 2)", c.forward),
            ("the backward counted as one forward: it is two, the weight's gradient and the input's", 2 * c.forward),
            (f"the first layer's input gradient counted: its input is the data, which needs no gradient, so its "
             f"backward is 2x its forward, not 4x ({2 * 2 * rows * i0 * o0:,} FLOPs too many)", c.flops + 2 * rows * i0 * o0),
            (f"the global batch of {batch} rows: this rank runs its share, {batch} / {n} = {rows}", n * c.flops),
            (f"the global batch of {batch} rows (this rank runs {rows}), and the first layer's input gradient "
             "counted (the data needs none)", n * (c.flops + 2 * rows * i0 * o0))])
        return (f"{call}: 'flops' is {flops:,.0f}, the run counted {c.flops:,} ({c.forward:,} forward + "
                f"{c.backward:,} backward, FlopCounterMode): " + (said or "count 2 r i o per linear forward, "
                "on this rank's r rows, and what its backward computes"))
    want = 2 * (n - 1) / n * c.buffer
    if not close(sent, want):
        weights = 4 * sum(i * o for i, o in sizes)
        said = first_match(sent, want, [
            ("the all-reduce's factor 2 forgotten: a ring all-reduce is a reduce-scatter and then an all-gather, "
             "each sends (n - 1) / n of the buffer", (n - 1) / n * c.buffer),
            ("the (n - 1) / n forgotten: each rank sends 2 (n - 1) chunks of buffer / n, not two whole buffers",
             2 * c.buffer),
            ("the buffer once: a ring all-reduce sends 2 (n - 1) / n of it (at n = 2 that is the buffer, not "
             "at n = 3)", c.buffer),
            ("the biases' gradients left out: DDP all-reduces every parameter's gradient, the biases' too",
             2 * (n - 1) / n * weights),
            ("bits, not bytes: 8 times too many", 8 * want),
            ("values, not bytes: each float32 gradient is 4 bytes", want / 4),
            ("every rank's sends added up: the question is what THIS rank sends", n * want)])
        return (f"{call}: 'bytes' is {sent:,.6g}, expected {want:,.6g}: 2 (n - 1) / n of the {c.buffer:,} "
                f"bytes of gradients the run handed to the all-reduce; " + (said or "what does one rank send "
                                                                              "in a ring all-reduce?"))
    compute, steps, wire = c.flops / rate, 2 * (n - 1), want / link
    want = compute + steps * latency + wire
    if close(seconds, want):
        return None
    said = first_match(seconds, want, [
        (f"the {'compute' if compute > steps * latency + wire else 'all-reduce'} alone, as max(compute, "
         "all-reduce) gives: that assumes one hides behind the other; the stated rule is no overlap, add them",
         max(compute, steps * latency + wire)),
        *[(f"{'the latency left out' if k == 0 else f'the latency paid {k} time' + 's' * (k > 1)}: a ring "
           f"all-reduce has 2 (n - 1) = {steps} steps, each pays it", compute + k * latency + wire)
          for k in sorted({0, 1, n - 1})],
        ("bits: the bytes times 8 over link_bytes_per_s, which is already bytes per second",
         compute + steps * latency + 8 * wire),
        ("the all-reduce's bytes divided by 8: link_bytes_per_s is bytes per second, not bits",
         compute + steps * latency + wire / 8),
        ("the whole buffer over the link: the time is what this rank sends, 'bytes'",
         compute + steps * latency + c.buffer / link),
        ("the all-reduce left out: with no overlap the step waits for it", compute),
        ("the compute left out: the step runs it before the all-reduce", steps * latency + wire)])
    return (f"{call}: 'seconds' is {seconds:.6g}, expected {want:.6g} = {compute:.4g} s of compute + "
            f"{steps * latency + wire:.4g} s of all-reduce; " + (said or "add the compute at matmul_flops and "
                                                                  "the all-reduce's latency and bytes"))


def predict_step_worker(rank: int, world_size: int, source: str, function: str, trace_dir: str) -> Report:
    """Each case: run the step under DDP on this world, count it, then ask the learner's prediction."""
    with traced(rank, trace_dir) as trace:
        fn = load_function(source, function, refuse=REFUSED)

        def case(sizes: list[tuple[int, int]], batch: int, *figures: float) -> str | None:
            counted = count_step(sizes, batch, rank, world_size)
            rate, link, latency = figures
            result = fn(sizes, batch, world_size, matmul_flops=rate, link_bytes_per_s=link, latency_s=latency)
            return wrong_prediction(result, counted, sizes, batch, world_size, figures)

        cases: list[Case] = [(f"linears {sizes}, {batch} rows", lambda a=a: case(*a))
                             for a in STEP_CASES for sizes, batch, *_ in [a]]
        return run_cases(trace, cases)


# (label, weights that multiply, embedding, tokens, GPUs, MFU, one GPU's dense peak FLOP/s)
DAYS_CASES = [("405B weights that multiply, 15.6T tokens, 16,384 H100s at 40% MFU", 405e9, 2.1e9, 15.6e12,
               16_384, 0.40, 989e12),
              ("124M weights (a GPT-2 small), 300B tokens, 16 A100s at 35% MFU", 123.6e6, 39.4e6, 300e9, 16, 0.35,
               312e12),
              ("6.5B weights, 2T tokens, 1,024 A100s at 45% MFU", 6.5e9, 0.131e9, 2e12, 1_024, 0.45, 312e12),
              ("69.5B weights, 15T tokens, 2,048 H100s at 38% MFU", 69.5e9, 1.05e9, 15e12, 2_048, 0.38, 989e12)]


def wrong_days(got: object, case: tuple) -> str | None:
    """None if ``got`` is the case's days; else which typical mistake (or two) gives that number."""
    label, n, embedding, tokens, gpus, mfu, peak = case
    seconds = model_flops_utilisation(6 * n * tokens, 1.0, peak, devices=gpus) / mfu  # the MFU of 1 s, over mfu
    want = seconds / 86_400
    if not isinstance(got, (int, float)) or isinstance(got, bool):
        return f"returned {got!r}, not a number of days"
    if close(got, want):
        return None
    factors = [(f"the job's FLOPs over ONE GPU's rate: {gpus:,} GPUs share the work", gpus),
               (f"the embedding counted in N: a lookup multiplies nothing, N is {n:g}, not {n + embedding:g}",
                (n + embedding) / n),
               ("2 N D: the forward alone; the backward does twice as much again (6 N D)", 1 / 3),
               ("8 N D: the recomputed forward counted; MFU counts model FLOPs only, 6 N D", 4 / 3),
               ("the MFU left out: the GPUs do not run at their peak", mfu),
               ("seconds, not days", 86_400.0), ("hours, not days", 24.0), ("minutes, not days", 1_440.0)]
    for k in (1, 2):
        for chosen in combinations(factors, k):
            if close(got, want * math.prod(f for _, f in chosen)):
                return f"{got:.6g} days, expected {want:.6g}: " + "; and ".join(what for what, _ in chosen)
    return f"{got:.6g} days, expected {want:.6g}: count 6 FLOPs per weight that multiplies per token"


def days_to_train_worker(rank: int, world_size: int, source: str, function: str, trace_dir: str) -> Report:
    """Each case in ``DAYS_CASES``: the learner's days against the reference's."""
    with traced(rank, trace_dir) as trace:
        fn = load_function(source, function, refuse=REFUSED)

        def case(c: tuple) -> str | None:
            _, n, embedding, tokens, gpus, mfu, peak = c
            return wrong_days(fn(n, embedding, tokens, gpus=gpus, mfu=mfu, peak_flops=peak), c)

        return run_cases(trace, [(c[0], lambda c=c: case(c)) for c in DAYS_CASES])


EXERCISES = [
    Exercise(
        name="predict_step", number="23.3", lesson=23, notebook="23_how_fast.ipynb",
        title="predict a DDP step's FLOPs, bytes and seconds, then run it", level="medium",
        task=("For one rank of an MLP trained under DDP, predict the FLOPs of its forward and backward, the "
              "bytes it sends in the gradients' ring all-reduce, and the step's seconds at a given matmul rate, "
              "link bandwidth and latency, with no overlap. The checker runs the step and counts."),
        hint=("Three terms, one rank. FLOPs: a linear on r rows does 2 r i o forward; what does its backward "
              "compute, and what does the first layer's backward skip? Bytes: which gradients does DDP all-reduce, "
              "and what share does one rank send in a ring? Seconds: compute, then the all-reduce."),
        more_hints=("Backward: 2 r i o for the weight's gradient, 2 r i o for the input's, except the first "
                    "layer (its input is data). r = batch / world_size. The gradients: i o + o float32 values per "
                    "layer, 4 bytes each; a ring all-reduce sends 2 (n - 1) / n of them in 2 (n - 1) steps.",
                    "flops = sum of 2 r i o x (2 for the first layer, 3 for the others); bytes = 2 (n - 1) / n x "
                    "4 x sum(i o + o); seconds = flops / matmul_flops + 2 (n - 1) latency_s + bytes / "
                    "link_bytes_per_s."),
        checks=("4 MLPs (1 to 4 linears), each run under DDP on the checker's gloo ranks: 'flops' against "
                "FlopCounterMode's count of the step, exactly; 'bytes' against 2 (n - 1) / n of the gradient "
                "bytes DDP handed to the all-reduce, and 'seconds' against the stated rule on those counts, "
                "within 1e-9; ddp_tutorial.performance is refused"),
        worker=predict_step_worker, world_sizes=(2, 3)),
    Exercise(
        name="days_to_train", number="23.4", lesson=23, notebook="23_how_fast.ipynb",
        title="days to train N parameters on D tokens on G GPUs at a given MFU", level="warm-up",
        task=("Return the days a training run takes: 6 N D model FLOPs (N the weights that multiply, attention "
              "left out) at the given MFU of every GPU's dense peak."),
        hint=("The job's model FLOPs over the job's model FLOPs per second: how many GPUs run them, and at what "
              "share of their peak? Which parameters multiply? Then seconds to days."),
        more_hints=("days = 6 x matmul_params x tokens / (gpus x mfu x peak_flops) / 86,400; the embedding and "
                    "the recomputed forward stay out.",),
        checks=("4 runs from a 124M model on 16 A100s to a 405B model on 16,384 H100s, against the course's "
                "mfu() turned around, within 1e-9; ddp_tutorial.performance is refused"),
        worker=days_to_train_worker, world_sizes=(1,)),
]
