"""Lesson 08's exercise: the bucketed DDP gradient hook that all-reduces and averages.

The reference is one process doing what all ranks do: every rank's batch through an
identical copy of the model, the gradients averaged. The learner's all-reduces are
recorded (``tracing``): one per bucket, in bucket order, asynchronous, and started
while backward still runs (the whole point of buckets); so is which kind of hook is
registered: ``register_post_accumulate_grad_hook``, as the contract says.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from ddp_tutorial.data_parallel.ddp_from_scratch import assign_buckets
from ddp_tutorial.env import rank_device
from ddp_tutorial.exercises.exercise import Exercise
from ddp_tutorial.exercises.harness import Case, Report, load_function, run_cases
from ddp_tutorial.exercises.tracing import Call, hook_registrations, traced
from ddp_tutorial.models import make_model

# (model, what the buckets look like, bucket_cap_mb): float64 parameters
LAYOUTS = [("toy", "one bucket per parameter", 1e-9), ("toy", "one bucket", 100.0),
           ("mlp", "buckets of at most 2 KB", 0.002)]
STEPS = 2


def batch(step: int, rank: int, shape: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 * step + rank)
    x, y = torch.randn(4, shape[0], generator=g, dtype=torch.float64), torch.randn(4, shape[1], generator=g,
                                                                                   dtype=torch.float64)
    return x.to(rank_device()), y.to(rank_device())


def grads(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
    model.zero_grad(set_to_none=True)
    nn.functional.mse_loss(model(x), y).backward()
    return [p.grad.clone() for p in model.parameters()]


def compare(got: torch.Tensor | None, want: torch.Tensor, local: torch.Tensor, n: int) -> str | None:
    """What ``got`` is, when it is not the mean ``want`` (``local``: this rank's own gradient)."""
    close = lambda a, b: torch.allclose(a, b, rtol=1e-9, atol=1e-12)  # noqa: E731  (a one-line helper, read beside its only use)
    if got is None:
        return "is None after finish()"
    if got.shape == want.shape and close(got, want):
        return None
    if got.shape != want.shape:
        return f"has shape {tuple(got.shape)}, not {tuple(want.shape)}"
    if n > 1 and close(got, want * n):
        return f"is the sum over the {n} ranks, not their mean: divide by the world size"
    if n > 1 and close(got, local):
        return ("is this rank's own gradient, not the mean over ranks: it was not all-reduced, or the "
                "all-reduced value was not copied back into p.grad")
    if n > 1 and close(got, local / n):
        return f"is this rank's own gradient divided by {n}: the all-reduce did not reach it"
    diff = (got - want).abs().reshape(-1)
    return f"differs from the mean over ranks by up to {diff.max().item():.3g} (at element {int(diff.argmax())})"


def structure(calls: list[Call], sizes: list[int]) -> str | None:
    """One asynchronous all-reduce per bucket, in bucket order, each started during backward."""
    reduces = [c for c in calls if c.kind == "all_reduce"]
    if [c.numel for c in reduces] != sizes:
        return (f"the gradients are right, but its all-reduces carried {[c.numel for c in reduces]} elements "
                f"where the buckets, in order, hold {sizes}: start exactly one all-reduce per bucket, on the "
                "bucket's gradients flattened into one tensor, bucket 0 first")
    for b, c in enumerate(reduces):
        if c.phase != "backward":
            return (f"the gradients are right, but bucket {b}'s all-reduce started after backward had "
                    "returned: start it from the hook, as soon as the bucket's last gradient is in, so "
                    "that it overlaps the rest of backward")
        if not c.async_op:
            return (f"the gradients are right, but bucket {b}'s all-reduce was blocking: backward stops until "
                    "it is done. Start it with async_op=True and wait for the handle in finish()")
    return None


def bucketed_grad_hooks_worker(rank: int, world_size: int, source: str, function: str, trace_dir: str) -> Report:
    """Each layout in ``LAYOUTS``, ``STEPS`` steps, every gradient compared with the one-process mean."""
    with traced(rank, trace_dir, record=("all_reduce",)) as trace:
        fn = load_function(source, function)

        def case(name: str, cap_mb: float) -> str | None:
            model, shape = make_model(name, seed=0, dtype=torch.float64)
            model.to(rank_device())
            reference = copy.deepcopy(model)  # before any hook is registered
            params, names = list(model.parameters()), [n for n, _ in model.named_parameters()]
            buckets = assign_buckets(params, cap_mb, first_bucket_mb=None)
            bucket_of = {i: b for b, indices in enumerate(buckets) for i in indices}
            with hook_registrations() as registered:
                finish = fn(params, buckets)
            early = [names[i] for i, p in enumerate(params) if ("register_hook", id(p)) in registered]
            if early:
                return (f"{early[0]}'s hook was registered with register_hook, which runs when the gradient is "
                        "computed, before it is accumulated into p.grad: with gradient accumulation (no_sync) "
                        "or a parameter used twice it sees a partial gradient. The contract names "
                        "p.register_post_accumulate_grad_hook(hook): it calls hook(p) once p.grad is final")
            if not callable(finish):
                return f"{function} returned {type(finish).__name__}, not the function finish()"
            for step in range(1, STEPS + 1):
                batches = [batch(step, r, shape) for r in range(world_size)]
                per_rank = [grads(reference, *b) for b in batches]
                mean = [sum(g[i] for g in per_rank) / world_size for i in range(len(params))]
                start = len(trace.calls)
                model.zero_grad(set_to_none=True)
                trace.phase = "backward"
                nn.functional.mse_loss(model(batches[rank][0]), batches[rank][1]).backward()
                trace.phase = "after backward"
                finish()
                trace.phase = ""
                later = " (step 1 was right: does finish() reset what the next backward needs?)" if step > 1 else ""
                for i, p in enumerate(params):
                    wrong = compare(p.grad, mean[i], per_rank[rank][i], world_size)
                    if wrong:
                        return (f"step {step}, parameter {names[i]} (index {i}, in bucket {bucket_of[i]} of "
                                f"{len(buckets)}): its gradient {wrong}{later}")
                sizes = [sum(params[i].numel() for i in indices) for indices in buckets]
                wrong = structure(trace.calls[start:], sizes)
                if wrong:
                    return f"step {step}: {wrong}{later}"
            return None

        cases: list[Case] = [(f"{name} model, {what}", lambda n=name, c=cap: case(n, c)) for name, what, cap in LAYOUTS]
        return run_cases(trace, cases)


EXERCISES = [
    Exercise(
        name="bucketed_grad_hooks", number="8.1", lesson=8, notebook="08_ddp_from_scratch.ipynb",
        title="the bucketed DDP gradient hook: all-reduce and average", level="hard",
        task=("Write what makes DDP fast: gradient hooks that fill buckets as backward produces the "
              "gradients, start one asynchronous all-reduce per full bucket (in bucket order), and a "
              "finish() that waits and puts the mean over ranks into every p.grad."),
        hint=("DDP's trick: a bucket's all-reduce can start the moment its last gradient exists, while "
              "backward still computes the others. So the hooks must know, per bucket, how many of its "
              "gradients are still missing, and where each gradient goes in the bucket's one flat tensor. "
              "Dividing by the world size can happen before the sum: the sum of the shares is the mean."),
        more_hints=(
            ("Set up once: per bucket a flat tensor (torch.zeros of the summed numel, the parameters' dtype "
             "and device), per parameter its slice as a view (flat[offset:offset + numel].view_as(p)), per "
             "bucket a count of missing gradients. A bucket that fills before an earlier one must wait for "
             "it: launch buckets strictly in order. finish() waits, copies each slice back into p.grad, "
             "and resets the counts."),
            ("In the hook for parameter i: torch.div(p.grad, world_size, out=slices[i]) (that is, "
             "p.grad / world_size into its slice); count down its bucket; then, while the next bucket in "
             "order has no gradient missing, works.append(dist.all_reduce(flats[len(works)], "
             "async_op=True)). finish(): for w in works: w.wait(); p.grad.copy_(slices[i]) for every "
             "parameter; works.clear(); reset the counts.")),
        checks=("a 4-parameter and a 6-parameter model in float64, with one bucket per parameter, one "
                "bucket, and buckets of at most 2 KB; two backward passes each; every gradient compared "
                "with the mean over ranks computed in one process; exactly one asynchronous all-reduce per "
                "bucket, in bucket order, each started before backward returned; hooks registered with "
                "register_post_accumulate_grad_hook"),
        worker=bucketed_grad_hooks_worker),
]
