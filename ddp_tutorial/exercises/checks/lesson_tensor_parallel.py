"""Lesson 14's exercise: a column-parallel + row-parallel linear pair by hand, one all-reduce.

The reference is the unsplit MLP computed in one process, in float64, from the same full
weights every rank makes from a fixed seed; the checker cuts the shards itself. The
learner's collectives are recorded: exactly one all-reduce, of the output's size.
"""

from __future__ import annotations

import torch

from ddp_tutorial.env import rank_device
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


def tp_mlp_forward_worker(rank: int, world_size: int, source: str, function: str, trace_dir: str) -> Report:
    """Each shape in ``SHAPES`` against the unsplit MLP in one process; one all-reduce each."""
    with traced(rank, trace_dir, record=COLLECTIVES) as trace:
        fn = load_function(source, function)

        def case(batch: int, d_in: int, per_rank: int, d_out: int, seed: int) -> str | None:
            w = weights(batch, d_in, per_rank * world_size, d_out, seed)
            mine = shard_range(per_rank * world_size, rank, world_size)
            on = rank_device()
            args = [w["x"], w["w1"][mine], w["b1"][mine], w["w2"][:, mine], w["b2"]]
            args = [a.clone().to(on) for a in args]
            kept = [a.clone() for a in args]
            got = fn(*args)
            wrong = explain(got, w, rank, world_size)
            if wrong:
                return wrong
            names = ["x", "w1_shard", "b1_shard", "w2_shard", "b2"]
            for name, a, k in zip(names, args, kept):
                if not torch.equal(a, k):
                    return f"the output is right, but {name} was changed: leave the arguments as they are"
            calls = [(c.kind, c.numel) for c in trace.calls]
            if not calls:
                return ("the output is right here, but no collective was called: with more ranks each one holds "
                        "only a partial sum, and the all-reduce that adds the ranks' partial outputs is missing")
            if calls != [("all_reduce", batch * d_out)]:
                return (f"the output is right, but its collectives were {calls or 'none'}; exactly one "
                        f"all_reduce of the partial output ({batch * d_out} elements) is all the pair needs")
            return None

        cases: list[Case] = [(f"batch {b}, in {i}, hidden {h * world_size} ({h} per rank), out {o}",
                              lambda b=b, i=i, h=h, o=o, s=s: case(b, i, h, o, s))
                             for s, (b, i, h, o) in enumerate(SHAPES)]
        return run_cases(trace, cases)


EXERCISES = [
    Exercise(
        name="tp_mlp_forward", number="14.1", lesson=14, notebook="14_tensor_parallel.ipynb",
        title="a column-parallel + row-parallel MLP by hand, one all-reduce", level="medium",
        task=("Compute relu(x W1^T + b1) W2^T + b2 with the hidden units split over the ranks: each rank "
              "holds its rows of W1 and b1 and the same units' columns of W2; one all-reduce, and every "
              "rank returns the full output."),
        hint=("The ReLU needs only the rank's own hidden units; the output is a sum over hidden units, so "
              "each rank's h @ w2_shard.T is a partial sum. Which term of the output must appear once, "
              "whatever n is?"),
        checks=("three shapes in float64 (a batch of 1, an output of 1), hidden units split evenly; every "
                "output compared with the unsplit MLP computed in one process; exactly one all-reduce, of "
                "the output's size; the arguments unchanged"),
        worker=tp_mlp_forward_worker),
]
