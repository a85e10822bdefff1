"""Lesson 19's exercise: the 1F1B order of a stage, simulated on every stage, then run for real.

Each rank asks the learner's ``one_f_one_b_order`` for its own stage's order; the checker
gathers them (its own ``all_gather_object``) and, before anything can hang, checks on paper:
every micro-batch's ``F`` and ``B`` once each, ``F`` first; no step where the stages would wait
for each other forever (``orders.simulate``: receives block, sends do not); no more than
``p - s`` micro-batches held by stage ``s``; no longer than 1F1B's ``m + p - 1`` slots. Then
the orders run for real (``one_f_one_b.run_order``: ``isend``/``irecv``, recorded), and the
gradients and the loss are compared with one process on the global batch.
"""

from __future__ import annotations

import torch.distributed as dist

from ddp_tutorial.env import rank_device
from ddp_tutorial.exercises.checks.pipeline_step import GPIPE, one_f_one_b_step_worker
from ddp_tutorial.exercises.exercise import Exercise
from ddp_tutorial.exercises.harness import Case, Report, load_function, run_cases
from ddp_tutorial.exercises.tracing import Trace, original, traced
from ddp_tutorial.pipeline_parallel.model_parallel import toy_batch
from ddp_tutorial.pipeline_parallel.one_f_one_b import (
    OUT_FEATURES,
    WIDTH,
    Recorder,
    build_layers,
    global_grads,
    one_process,
    run_order,
    stage_module,
)
from ddp_tutorial.pipeline_parallel.orders import Deadlock, idle_fraction, parse_action, simulate

REFUSED = ("ddp_tutorial.pipeline_parallel.orders", "ddp_tutorial.pipeline_parallel.one_f_one_b")
ROWS = 2  # rows per micro-batch


def well_formed(order: object, num_micro: int) -> str | None:
    """What is wrong with one stage's order on its own (None: nothing)."""
    if not isinstance(order, list) or not all(isinstance(a, str) for a in order):
        return f"returned {type(order).__name__}: return a list of strings such as ['F0', 'B0', ...]"
    try:
        actions = [parse_action(a) for a in order]
    except ValueError as err:
        return str(err)
    for i in range(num_micro):
        for kind in ("F", "B"):
            if actions.count((kind, i)) != 1:
                return f"{kind}{i} appears {actions.count((kind, i))} times: each micro-batch's F and B exactly once"
        if actions.index(("B", i)) < actions.index(("F", i)):
            return f"B{i} comes before F{i}: a micro-batch's backward needs its forward's activations"
    extra = [a for a in order if parse_action(a)[1] >= num_micro]
    return f"{extra[0]} names a micro-batch that does not exist (0 to {num_micro - 1})" if extra else None


def too_many_held(order: list[str], stage: int, num_stages: int) -> str | None:
    """The first step where the stage holds more than 1F1B's ``p - s`` micro-batches."""
    held = 0
    for step, action in enumerate(order):
        held += 1 if action.startswith("F") else -1
        if held > num_stages - stage:
            return (f"after step {step} ({action}) stage {stage} holds {held} micro-batches' activations; "
                    f"1F1B holds at most p - s = {num_stages - stage}: start a backward sooner")
    return None


def on_paper(orders: list[list[str]], num_micro: int) -> str | None:
    """Deadlock, memory and length of all the stages' orders together (None: all as 1F1B)."""
    p = len(orders)
    try:
        events = simulate(orders)
    except Deadlock as err:
        return f"with blocking receives the stages would wait for each other forever: {err}"
    for s, order in enumerate(orders):
        problem = too_many_held(order, s, p)
        if problem:
            return problem
    span, best = max(e[5] for e in events), 3.0 * (num_micro + p - 1)
    if span > best + 1e-9:
        return (f"safe, but slow: on a clock where F takes 1 and B 2 the pipeline takes {span:g}, 1F1B takes "
                f"{best:g} (idle {idle_fraction(events):.0%}); fill the pipe with p - 1 - s forwards first")
    return None


def one_f_one_b_order_worker(rank: int, world_size: int, source: str, function: str, trace_dir: str) -> Report:
    """Micro-batch counts 1, p - 1, p and 2p + 1; this rank is stage ``rank`` of ``world_size``."""
    # nothing forbidden: the order is plain data, and the checker's own all_gather_object would trip it
    with traced(rank, trace_dir) as trace:
        fn = load_function(source, function, refuse=REFUSED)

        def case(num_micro: int) -> str | None:
            order = fn(rank, world_size, num_micro)
            problem = well_formed(order, num_micro)
            orders: list = [None] * world_size
            original("all_gather_object")(orders, None if problem else order)
            if problem and num_micro < world_size - 1 - rank:  # a warm-up longer than the micro-batches
                problem += (f"; with {num_micro} micro-batch(es), fewer than this stage's p - 1 - s = "
                            f"{world_size - 1 - rank} warm-up forwards, cap the warm-up at m: min(p - 1 - s, m)")
            if problem:
                return f"stage {rank}: {problem}"
            if any(o is None for o in orders):
                return None  # another stage's order is malformed: its rank says how
            problem = on_paper(orders, num_micro)
            return problem or run_for_real(orders, num_micro, trace)

        def run_for_real(orders: list[list[str]], num_micro: int, trace: Trace) -> str | None:
            device = rank_device()
            module, first = stage_module(build_layers(2 * world_size), rank, world_size)
            x, y = toy_batch(0, num_micro * ROWS, 0, WIDTH, OUT_FEATURES)
            loss = run_order(module.to(device), orders, x.to(device).split(ROWS), ys=y.to(device).split(ROWS),
                             stage=rank, recorder=Recorder(rank))
            messages = sum(c.kind in ("isend", "irecv") for c in trace.calls)
            want = 2 * num_micro * ((rank > 0) + (rank < world_size - 1))
            if messages != want:
                return f"stage {rank} exchanged {messages} messages, 1F1B needs {want} (an F and a B per neighbour)"
            reference = one_process(2 * world_size, num_micro * ROWS)
            for name, grad in global_grads(module, first).items():
                if (grad - reference["grads"][name]).abs().max() > 1e-12:
                    return f"stage {rank}: the gradient of layer {name} differs from one process's"
            if loss is not None and abs(loss.item() - reference["loss"]) > 1e-12:
                return f"the last stage's loss {loss.item():.6g} is not one process's {reference['loss']:.6g}"
            return None

        # fewer micro-batches than stages (1, p - 1) too: there the warm-up must stop at m
        counts = sorted({1, world_size - 1, world_size, 2 * world_size + 1} - {0})
        cases: list[Case] = [(f"{m} micro-batches on {world_size} stages", lambda m=m: case(m)) for m in counts]
        report = run_cases(trace, cases)
        dist.barrier()
        return report


EXERCISES = [
    Exercise(
        name="one_f_one_b_order", number="19.1", lesson=19, notebook="19_pipeline_schedules.ipynb",
        title="the 1F1B order of a pipeline stage", level="medium",
        task=("Return the order in which stage `stage` of `num_stages` runs the forwards ('F<i>') and "
              "backwards ('B<i>') of `num_micro` micro-batches under 1F1B: no deadlock when every stage "
              "runs its order at once, at most `num_stages - stage` micro-batches held, and no bubble "
              "larger than 1F1B's."),
        hint=("Three phases: a warm-up of forwards only, a steady state that alternates one forward and one "
              "backward, a cool-down of backwards only. The last stage needs no warm-up."),
        more_hints=("The warm-up of stage s is p - 1 - s forwards (never more than m). In the steady state the "
                    "backward that follows F<i> is the oldest one still open: B<i - warm-up>.",),
        checks=("micro-batch counts 1, p - 1, p and 2p + 1 on 1, 2 and 3 stages: each F and B once, F first; the orders "
                "simulated together (a deadlock named by stage, step and what it waits for); at most p - s held "
                "by stage s; no longer than m + p - 1 slots; then run with isend/irecv and the gradients and "
                "loss compared with one process (1e-12)"),
        worker=one_f_one_b_order_worker),
    Exercise(
        name="one_f_one_b_step", number="19.2", lesson=19, notebook="19_pipeline_schedules.ipynb",
        title="a 1F1B training step with real messages", level="hard",
        task=("Run one training step of stage `stage` of `num_stages` (this rank) on `num_micro` micro-batches "
              "under 1F1B: activations forward and gradients back with isend/irecv to the neighbour stages, "
              "the parameters' gradients those of one process on the whole batch, never more than "
              "`min(num_stages - stage, num_micro)` micro-batches' activations held, no deadlock."),
        hint=("A forward needs its input from the previous stage and a backward needs its output's gradient from "
              "the next: those receives must complete before the compute. Sends need not: a stage that waits for "
              "its own send while its neighbour waits for its own is the deadlock of the steady state."),
        more_hints=("Keep each micro-batch's input and output until its backward, and drop them there: that is "
                    "what frees its activations. Backward adds into .grad, so the micro-batches accumulate by "
                    "themselves if nothing zeroes them; the loss each one backpropagates is its share of the "
                    "whole batch's mean.",
                    "Stage s runs w = min(p - 1 - s, m) forwards, then for i = w .. m - 1 the forward of i and "
                    "the backward of i - w, then the backwards of m - w .. m - 1. A forward: irecv from s - 1 "
                    "(waited), requires_grad on it, the module, isend to s + 1 (last stage: loss_fn(out, i) / m). "
                    "A backward: irecv the gradient from s + 1 (waited), out.backward(grad), isend the input's "
                    ".grad to s - 1. Wait on every send before returning."),
        checks=("micro-batch counts 1, p and 2p + 1 on 2, 3 and 4 stages: every send to a neighbour, of the "
                "activation's size, one activation and one gradient per micro-batch per neighbour, no collective; "
                "each stage's order of forwards and backwards (saved-tensor hooks) equal to 1F1B's, never more "
                f"than min(p - s, m) micro-batches' activations alive (\"{GPIPE}\" otherwise); the gradients "
                "and the loss compared with the unsplit model on the whole batch (1e-12); a hang named by call and line; "
                "the lesson's own 1F1B and torch.distributed.pipelining refused"),
        hang_hint=("a deadlock: each stuck rank waits for a neighbour that is itself waiting. With blocking "
                   "send/recv two neighbours that both send first wait forever in the steady state: send with "
                   "isend and wait only on what you receive (or pair them with batch_isend_irecv); a stage stuck "
                   "receiving a gradient may also be waiting for one its neighbour never sends"),
        world_sizes=(2, 3, 4), worker=one_f_one_b_step_worker),
]
