"""Lesson 15's exercise: a column-parallel + row-parallel linear pair by hand, forward and backward.

The reference is the unsplit MLP computed in one process, in float64, from the same full
weights every rank makes from a fixed seed; the checker cuts the shards itself, runs the
learner's forward, then ``backward()`` of the same loss on every rank, and compares the
output, ``x.grad``, ``b2.grad`` and each shard's gradient with the unsplit MLP's. The
collectives are counted with torch's ``CommDebugMode``, which sees ``dist.all_reduce`` as
well as functional collectives and DTensor's: one all-reduce in forward (``g``), one in
backward (``f``).

Exercise 15.2, the gradient all-reduce of a ``dp x tp`` mesh over ``dp`` only, is checked in
``mesh_gradients`` and listed here.
"""

from __future__ import annotations

import torch
from torch.distributed.tensor.debug import CommDebugMode

from ddp_tutorial.env import rank_device
from ddp_tutorial.exercises.checks.mesh_gradients import DP_GRAD_AVERAGE
from ddp_tutorial.exercises.exercise import Exercise
from ddp_tutorial.exercises.harness import Case, Report, load_function, run_cases
from ddp_tutorial.exercises.tracing import COLLECTIVES, traced
from ddp_tutorial.tensor_parallel.split_mlp import shard_range

# (batch, in, hidden per rank, out)
SHAPES = [(3, 5, 2, 4), (1, 3, 1, 2), (4, 6, 3, 1)]


def weights(batch: int, d_in: int, hidden: int, d_out: int, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731  (a one-line helper, read beside its only use)
    return {"x": r(batch, d_in), "w1": r(hidden, d_in), "b1": r(hidden), "w2": r(d_out, hidden),
            "b2": r(d_out) + 3.0}  # a bias far from 0: adding it n times shows


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.allclose(a, b, rtol=1e-10, atol=1e-10)


def explain(got: object, w: dict[str, torch.Tensor], rank: int, n: int) -> str | None:
    """None if ``got`` is the unsplit MLP's output; else what it is instead."""
    full_h = torch.relu(w["x"] @ w["w1"].T + w["b1"])
    want = full_h @ w["w2"].T + w["b2"]
    if not isinstance(got, torch.Tensor):
        return f"returned {type(got).__name__}, not the output tensor"
    got = got.detach().cpu()
    if got.shape != want.shape:
        return f"the output has shape {tuple(got.shape)}, expected {tuple(want.shape)} (batch, out)"
    if close(got, want):
        return None
    mine = shard_range(w["w1"].shape[0], rank, n)
    partial = full_h[:, mine] @ w["w2"][:, mine].T
    if n > 1 and close(got, want + (n - 1) * w["b2"]):
        return (f"the output holds b2 {n} times: the bias was added on every rank before the all-reduce "
                "summed the ranks; add b2 once, after the all-reduce")
    if n > 1 and close(got, partial + w["b2"]):
        return ("the output is only this rank's hidden units' share (its partial sum) plus b2: the all-reduce "
                "that adds the ranks' partial outputs is missing, or its result is not used")
    if n > 1 and close(got, (want - w["b2"]) / n + w["b2"]):
        return (f"the output is the mean of the ranks' partial outputs, {n} times too small: each rank holds "
                "part of a sum over hidden units, so all-reduce with SUM, not AVG")
    if close(got, (w["x"] @ w["w1"].T + w["b1"]) @ w["w2"].T + w["b2"]):
        return "the output equals the MLP without its ReLU: apply relu to the hidden activations"
    if n > 1 and close(got, torch.relu(want - w["b2"]) + w["b2"]) or close(got, torch.relu(want)):
        return ("the ReLU was applied after the second layer; it belongs to the hidden activations, "
                "before the row-parallel linear")
    diff = (got - want).abs()
    i = divmod(int(diff.reshape(-1).argmax()), want.shape[1])
    return (f"the output differs from the unsplit MLP by up to {diff.max().item():.3g} (sample {i[0]}, output "
            f"{i[1]}); are the shards used as given (x @ w1_shard.T, h @ w2_shard.T)?")


def counted(mode: CommDebugMode) -> dict[str, int]:
    """The collectives ``mode`` saw, by short name: ``{"all_reduce": 1}`` (c10d's and functional alike)."""
    counts: dict[str, int] = {}
    for op, k in mode.get_comm_counts().items():
        name = str(op).split(".")[-1].rstrip("_").replace("allreduce", "all_reduce")
        counts[name] = counts.get(name, 0) + k
    return counts


def full_grads(w: dict[str, torch.Tensor], weight: torch.Tensor) -> dict[str, torch.Tensor]:
    """The unsplit MLP's gradients of ``(output * weight).sum()``, in one process."""
    leaves = {k: v.clone().requires_grad_() for k, v in w.items()}
    out = torch.relu(leaves["x"] @ leaves["w1"].T + leaves["b1"]) @ leaves["w2"].T + leaves["b2"]
    (out * weight).sum().backward()
    return {k: v.grad for k, v in leaves.items()}


def wrong_grads(args: list[torch.Tensor], full: dict[str, torch.Tensor], mine: slice, n: int) -> str | None:
    """What is wrong with the gradients of x, the shards and b2 (None: all right)."""
    want = {"x": full["x"], "w1_shard": full["w1"][mine], "b1_shard": full["b1"][mine],
            "w2_shard": full["w2"][:, mine], "b2": full["b2"]}
    for name, a in zip(want, args):
        g = None if a.grad is None else a.grad.detach().cpu()
        if g is None:
            return (f"after backward, {name}.grad is None: the graph from {name} to the output is cut (a "
                    ".detach(), torch.no_grad(), or an all-reduce result autograd does not know about?)")
        if close(g, want[name]):
            continue
        if n > 1 and close(g, n * want[name]):
            return (f"{name}.grad is {n} times the unsplit MLP's: a backward all-reduced a gradient that every "
                    "rank already holds whole (torch.distributed.nn.functional.all_reduce does that). The "
                    "output's all-reduce (g) passes its gradient through unchanged in backward")
        if name == "x":
            return ("x.grad is not the unsplit MLP's: each rank's gradient of x covers its own hidden units "
                    "only; the sum over ranks is the answer. That is Megatron's f at the input: the "
                    "identity in forward, an all-reduce of the gradient in backward (an autograd.Function)")
        return f"{name}.grad differs from its slice of the unsplit MLP's by up to {(g - want[name]).abs().max().item():.3g}"
    return None


def tp_mlp_forward_worker(rank: int, world_size: int, source: str, function: str, trace_dir: str) -> Report:
    """Each shape in ``SHAPES`` against the unsplit MLP in one process; one all-reduce each way."""
    with traced(rank, trace_dir, record=COLLECTIVES) as trace:  # the log names a stuck collective
        fn = load_function(source, function, refuse=("ddp_tutorial.tensor_parallel",))

        def case(batch: int, d_in: int, per_rank: int, d_out: int, seed: int) -> str | None:
            w = weights(batch, d_in, per_rank * world_size, d_out, seed)
            mine = shard_range(per_rank * world_size, rank, world_size)
            on = rank_device()
            args = [w["x"], w["w1"][mine], w["b1"][mine], w["w2"][:, mine], w["b2"]]
            args = [a.clone().to(on).requires_grad_() for a in args]
            kept = [a.detach().clone() for a in args]
            with CommDebugMode() as forward:
                got = fn(*args)
            wrong = explain(got, w, rank, world_size)
            if wrong:
                return wrong
            names = ["x", "w1_shard", "b1_shard", "w2_shard", "b2"]
            for name, a, k in zip(names, args, kept):
                if not torch.equal(a.detach(), k):
                    return f"the output is right, but {name} was changed: leave the arguments as they are"
            if world_size > 1 and counted(forward) != {"all_reduce": 1}:
                said = counted(forward) or "none"
                return (f"the output is right, but its forward's collectives were {said}: exactly one all-reduce "
                        "(of the partial output) is all the pair needs")
            if not got.requires_grad:
                return ("the output is right but carries no autograd graph: no torch.no_grad() or .detach(); "
                        "the checker calls backward() on it")
            weight = torch.randn(got.shape, generator=torch.Generator().manual_seed(seed + 100),
                                 dtype=torch.float64)  # the same loss on every rank
            with CommDebugMode() as backward:
                try:
                    (got * weight.to(on)).sum().backward()
                except RuntimeError as err:
                    return (f"the output is right, but backward() through it failed ({str(err).splitlines()[0]}): "
                            "wrap each collective in a torch.autograd.Function that says what backward does")
            wrong = wrong_grads(args, full_grads(w, weight), mine, world_size)
            if wrong:
                return "the output is right, but " + wrong
            if world_size > 1 and counted(backward) != {"all_reduce": 1}:
                return (f"the gradients are right, but backward's collectives were {counted(backward) or 'none'}: "
                        "exactly one all-reduce, of x's gradient (f), is all backward needs")
            return None

        cases: list[Case] = [(f"batch {b}, in {i}, hidden {h * world_size} ({h} per rank), out {o}",
                              lambda b=b, i=i, h=h, o=o, s=s: case(b, i, h, o, s))
                             for s, (b, i, h, o) in enumerate(SHAPES)]
        return run_cases(trace, cases)


EXERCISES = [
    Exercise(
        name="tp_mlp_forward", number="15.1", lesson=15, notebook="15_tensor_parallel.ipynb",
        title="a column- and row-parallel MLP by hand: f and g", level="medium",
        task=("Compute relu(x W1^T + b1) W2^T + b2 with the hidden units split over the ranks: each rank "
              "holds its rows of W1 and b1 and the same units' columns of W2; one all-reduce in forward, "
              "every rank returns the full output, and backward gives the unsplit MLP's gradients with one "
              "all-reduce more."),
        hint=("The ReLU needs only the rank's own hidden units; the output is a sum over hidden units, so "
              "each rank's h @ w2_shard.T is a partial sum. Which term of the output must appear once, "
              "whatever n is? Then backward: whose gradient of x does each rank hold?"),
        checks=("three shapes in float64 (a batch of 1, an output of 1), hidden units split evenly; every "
                "output, and after backward() of the same loss on every rank the gradients of x, b2 and each "
                "shard, compared with the unsplit MLP computed in one process; exactly one all-reduce in "
                "forward and one in backward (counted by CommDebugMode: dist, functional collectives and "
                "DTensor alike); the arguments unchanged; ddp_tutorial.tensor_parallel is refused"),
        worker=tp_mlp_forward_worker),
    DP_GRAD_AVERAGE,  # 15.2: the gradient all-reduce of a dp x tp mesh, over dp only (checked in mesh_gradients)
]
