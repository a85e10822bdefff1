"""Lesson 14's exercise: one ZeRO-1 step (reduce-scatter, Adam on my slice, all-gather).

The reference is one process: ``torch.optim.Adam`` on the whole flat parameter vector
with the gradient averaged over every rank's gradient (each rank makes every rank's
gradient from the same seeds), i.e. DDP + Adam. After each of three steps the checker
compares this rank's Adam state with the reference state's slice ``r`` (which names a
wrong slice, a sum for a mean, a missing reduce-scatter), then the whole parameter vector
(which names a missing all-gather). The collectives are recorded: with more than one rank,
each step is exactly one reduce-scatter then one all-gather (an all-reduce of the whole
gradient gives the same numbers for more traffic, and is refused).
"""

from __future__ import annotations

import torch

from ddp_tutorial.env import rank_device
from ddp_tutorial.exercises.exercise import Exercise
from ddp_tutorial.exercises.harness import Case, Report, load_function, run_cases
from ddp_tutorial.exercises.tracing import ALL_GATHERS, COLLECTIVES, REDUCE_SCATTERS, Call, traced

SLICES = (3, 1, 5)  # elements per rank: numel = slice * world size
STEPS, LR = 3, 0.1


def grad_of(step: int, rank: int, numel: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * seed + 10 * step + rank)
    return torch.randn(numel, generator=g, dtype=torch.float64) * (rank + 1)


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.allclose(a, b, rtol=1e-9, atol=1e-12)


def wrong_state(name: str, got: object, ref: torch.Tensor, rank: int, n: int, s: int, local: torch.Tensor | None,
                step: int) -> str | None:
    """What is wrong with ``state[name]`` against the reference's slice ``rank`` (``local``: step 1, own grad)."""
    want = ref[rank * s:(rank + 1) * s]
    if not isinstance(got, torch.Tensor):
        return f'state["{name}"] is a {type(got).__name__}, not a tensor'
    got = got.detach().cpu()
    if close(got, want):
        return None
    if got.numel() == ref.numel():
        return (f'state["{name}"] has {got.numel()} elements, the whole vector: ZeRO-1 keeps the state of '
                f"this rank's slice only ({s} elements)")
    if got.shape != want.shape:
        return f'state["{name}"] has shape {tuple(got.shape)}, expected ({s},): this rank\'s slice'
    for k in range(n):
        if k != rank and close(got, ref[k * s:(k + 1) * s]):
            return (f'state["{name}"] holds the state of slice {k} (elements {k * s}..{(k + 1) * s - 1}), not of '
                    f"this rank's slice {rank} (elements {rank * s}..{(rank + 1) * s - 1}): is the slice offset "
                    "rank * s?")
    power = 1 if name == "exp_avg" else 2
    if n > 1 and close(got, want * n ** power):
        return (f'state["{name}"] is {n ** power} times the reference\'s: the gradient was the sum over the {n} '
                "ranks, not their mean: divide what the reduce-scatter returns by the world size")
    if n > 1 and local is not None:
        own = local[rank * s:(rank + 1) * s]
        if close(got, (0.1 * own) if power == 1 else (0.001 * own * own)):
            return (f'state["{name}"] was updated with this rank\'s own gradient, not the mean over ranks: '
                    "reduce-scatter the gradients first (and divide by the world size)")
    return (f'state["{name}"] differs from torch.optim.Adam\'s (on the mean gradient) by up to '
            f"{(got - want).abs().max().item():.3g} after step {step}")


def wrong_params(got: torch.Tensor, want: torch.Tensor, before: torch.Tensor, rank: int, n: int, s: int) -> str | None:
    if close(got, want):
        return None
    bad = [k for k in range(n) if not close(got[k * s:(k + 1) * s], want[k * s:(k + 1) * s])]
    k = bad[0]
    part = f"slice {k} (elements {k * s}..{(k + 1) * s - 1})"
    if rank not in bad and all(close(got[j * s:(j + 1) * s], before[j * s:(j + 1) * s]) for j in bad):
        return (f"params_flat: this rank's own slice {rank} is right, but {part} still holds the parameters "
                "from before the step: the all-gather that brings every rank's updated slice is missing")
    if k == rank:
        return (f"params_flat: this rank's own slice {rank} (elements {rank * s}..{(rank + 1) * s - 1}) differs "
                f"from torch.optim.Adam's by up to {(got - want)[k * s:(k + 1) * s].abs().max().item():.3g}, "
                "though its Adam state is right: is the parameter slice taken at rank * s .. (rank + 1) * s, the "
                "elements of the gradient slice? If so, check the bias corrections and where eps goes")
    return (f"params_flat: {part}, which rank {k} updates and all-gathers, differs from torch.optim.Adam's by up "
            f"to {(got - want).abs().max().item():.3g}: does rank {k} update the elements of its own slice, "
            "rank * s .. (rank + 1) * s, and does the all-gather put the slices back in rank order?")


def wrong_collectives(calls: list[Call], numel: int, n: int) -> str | None:
    """ZeRO-1's traffic: one reduce-scatter of the gradients, then one all-gather of the parameters."""
    kinds = [c.kind for c in calls]
    if len(kinds) == 2 and kinds[0] in REDUCE_SCATTERS and kinds[1] in ALL_GATHERS:
        return None
    said = ", ".join(f"dist.{k}" for k in kinds) or "none"
    if any(k == "all_reduce" for k in kinds):
        return (f"the numbers are right, but its collectives were {said}: an all-reduce gives every rank all "
                f"{numel} summed gradients, 2 (n - 1) / n of the vector sent per rank, where ZeRO-1 needs only "
                "its own slice. One reduce-scatter ((n - 1) / n) then one all-gather ((n - 1) / n) is DDP's "
                "traffic; the all-reduce and the all-gather together are 3 (n - 1) / n, half as much again. "
                "Use reduce_scatter_single for the gradients")
    return (f"the numbers are right, but its collectives were {said}; a ZeRO-1 step is exactly one "
            "reduce-scatter of the gradients (reduce_scatter_single) then one all-gather of the updated "
            "slices (all_gather_single)")


def zero1_step_worker(rank: int, world_size: int, source: str, function: str, trace_dir: str) -> Report:
    """Each slice size in ``SLICES``: ``STEPS`` steps against one process's ``torch.optim.Adam``."""
    with traced(rank, trace_dir, record=COLLECTIVES) as trace:
        fn = load_function(source, function)
        n = world_size

        def case(s: int, seed: int) -> str | None:
            numel = s * n
            start = torch.randn(numel, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
            reference = torch.nn.Parameter(start.clone())
            adam = torch.optim.Adam([reference], lr=LR)
            params = start.clone().to(rank_device())
            state = {"step": 0, "exp_avg": torch.zeros(s, dtype=torch.float64, device=rank_device()),
                     "exp_avg_sq": torch.zeros(s, dtype=torch.float64, device=rank_device())}
            for step in range(1, STEPS + 1):
                grads = [grad_of(step, r, numel, seed) for r in range(n)]
                reference.grad = sum(grads) / n
                adam.step()
                before = params.detach().cpu().clone()
                start = len(trace.calls)
                result = fn(params, grads[rank].clone().to(rank_device()), state, LR)
                at = f"step {step}: "
                if result is not None:
                    return at + f"{function} returned {type(result).__name__}; it updates in place and returns None"
                if state.get("step") != step:
                    return at + f'state["step"] is {state.get("step")!r}, expected {step}: count the steps (Adam\'s bias correction needs it)'
                ref_state = adam.state[reference]
                for name in ("exp_avg", "exp_avg_sq"):
                    wrong = wrong_state(name, state.get(name), ref_state[name].detach(), rank, n, s,
                                        grads[rank] if step == 1 else None, step)
                    if wrong:
                        return at + wrong
                wrong = wrong_params(params.detach().cpu(), reference.detach(), before, rank, n, s)
                if not wrong and n > 1:
                    wrong = wrong_collectives(trace.calls[start:], numel, n)
                if wrong:
                    return at + wrong
            return None

        cases: list[Case] = [(f"{s * world_size} parameters ({s} per rank), {STEPS} Adam steps",
                              lambda s=s, seed=i: case(s, seed)) for i, s in enumerate(SLICES)]
        return run_cases(trace, cases)


EXERCISES = [
    Exercise(
        name="zero1_step", number="14.1", lesson=14, notebook="14_sharding.ipynb",
        title="one ZeRO-1 step: reduce-scatter, Adam on my slice, all-gather", level="hard",
        task=("Write one optimizer step of ZeRO-1 on a flat parameter vector: reduce-scatter the "
              "gradients to the mean of my slice, Adam on my slice with my slice's state only, all-gather "
              "the updated slices; every rank ends with what DDP + Adam gives."),
        hint=("Adam is elementwise: the update of element i needs only element i's gradient and state. "
              "So rank r can own one slice of the vector, keep Adam's state for it alone, and needs the "
              "mean gradient of that slice only: which collective delivers exactly that? And how does "
              "every rank get the slices the others updated?"),
        more_hints=(
            ("Slices of s = numel // n elements: rank r owns params_flat[r * s:(r + 1) * s], a view (updated "
             "in place, it updates params_flat). reduce_scatter_single(out, grads_flat) from "
             "ddp_tutorial.comm.collectives puts the sum of every rank's slice r into out (s elements) on "
             "rank r; divide by n. all_gather_single(params_flat, my_slice) fills params_flat with every "
             "rank's slice, in rank order."),
            ("Adam on my slice, with g the mean gradient and b1, b2 = 0.9, 0.999: step += 1; m = b1 m + "
             "(1 - b1) g; v = b2 v + (1 - b2) g * g; p -= lr * (m / (1 - b1 ** step)) / (sqrt(v / (1 - b2 "
             "** step)) + 1e-8). Do it under torch.no_grad(), in place on state['exp_avg'], "
             "state['exp_avg_sq'] and the slice view, then the all-gather. The all-gather's input may be "
             "that view itself (it is exactly this rank's place in the output: an in-place all-gather) or a "
             "copy; never a tensor that overlaps another rank's place.")),
        checks=("3, 1 and 5 elements per rank, three Adam steps each, float64, gradients different on every "
                "rank; after each step this rank's Adam state compared with torch.optim.Adam's state on the "
                "averaged gradient (its slice r), and the whole parameter vector with torch.optim.Adam's in "
                "one process; exactly one reduce-scatter then one all-gather per step (no all-reduce)"),
        worker=zero1_step_worker),
]
