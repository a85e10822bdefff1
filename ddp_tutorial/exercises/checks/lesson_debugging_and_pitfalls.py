"""Lesson 12's exercise: find the bug in a data-parallel step (gradients and loss summed, not averaged).

The reference is one process doing SGD on all ranks' batches concatenated (the global
batch), from the same seeded model, in float64. After each of three steps the checker
compares the returned loss with the global batch's loss, every parameter with the
reference, and every ``p.grad`` with the global batch's gradient (so a summed gradient
made up for by a learning rate divided by ``n`` is caught: weight decay, momentum, Adam or
clipping would all read the wrong gradient); a step ``n`` times too long, or a loss that is
this rank's own, is named.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from ddp_tutorial.env import rank_device
from ddp_tutorial.exercises.exercise import Exercise
from ddp_tutorial.exercises.harness import Case, Report, load_function, run_cases
from ddp_tutorial.exercises.tracing import traced

STEPS, LR = 3, 0.05
MODELS = [("Linear(3, 2)", lambda: nn.Linear(3, 2)),
          ("Linear(4, 3) -> ReLU -> Linear(3, 1)", lambda: nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 1)))]


def batch(step: int, rank: int, d_in: int, d_out: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(10_000 * seed + 100 * step + rank)
    return (torch.randn(4, d_in, generator=g, dtype=torch.float64),
            torch.randn(4, d_out, generator=g, dtype=torch.float64) * (rank + 1))


def close(a: torch.Tensor | float, b: torch.Tensor | float) -> bool:
    return torch.allclose(torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64),
                          rtol=1e-9, atol=1e-12)


def fix_summed_loss_worker(rank: int, world_size: int, source: str, function: str, trace_dir: str) -> Report:
    """Each model in ``MODELS``, ``STEPS`` steps, against one process on the global batch."""
    with traced(rank, trace_dir, record=("all_reduce",)) as trace:
        fn = load_function(source, function)
        n = world_size

        def case(make, seed: int) -> str | None:
            torch.manual_seed(seed)
            reference = make().double()
            model = copy.deepcopy(reference).to(rank_device())
            d_in = next(reference.parameters()).shape[1]
            d_out = list(reference.parameters())[-1].shape[0]
            names = [name for name, _ in reference.named_parameters()]
            for step in range(1, STEPS + 1):
                batches = [batch(step, r, d_in, d_out, seed) for r in range(n)]
                before = [p.detach().clone() for p in reference.parameters()]
                reference.zero_grad()
                x_all, y_all = torch.cat([b[0] for b in batches]), torch.cat([b[1] for b in batches])
                global_loss = nn.functional.mse_loss(reference(x_all), y_all)
                global_loss.backward()
                mean_grads = [p.grad.detach().clone() for p in reference.parameters()]
                with torch.no_grad():
                    local_loss = nn.functional.mse_loss(reference(batches[rank][0]), batches[rank][1]).item()
                    for p in reference.parameters():
                        p -= LR * p.grad
                x, y = (t.to(rank_device()) for t in batches[rank])
                got = fn(model, x, y, LR)
                at = f"step {step}: "
                for name, p, p0, want in zip(names, model.parameters(), before, reference.parameters()):
                    p = p.detach().cpu()
                    if close(p, want):
                        continue
                    if n > 1 and close(p - p0, n * (want - p0)):
                        return at + (f"parameter {name} moved {n} times as far as one process on the global batch "
                                     f"moves it: the gradients were summed over the {n} ranks, not averaged; divide "
                                     "them by the world size (DDP's mean), or the learning rate is silently n "
                                     "times too large")
                    if torch.equal(p, p0):
                        return at + f"parameter {name} did not change: the SGD update is missing"
                    return at + (f"parameter {name} differs from one process on the global batch by up to "
                                 f"{(p - want).abs().max().item():.3g}")
                for name, p, want in zip(names, model.parameters(), mean_grads):
                    g = None if p.grad is None else p.grad.detach().cpu()
                    if g is None:
                        return at + f"the parameters are right, but {name}.grad is None after the step"
                    if close(g, want):
                        continue
                    if n > 1 and close(g, n * want):
                        return at + (f"the parameters are right, but {name}.grad is the sum over the {n} ranks, "
                                     "not the global batch's gradient (their mean): a learning rate divided by "
                                     "n makes up for it in plain SGD only; weight decay, momentum, Adam or "
                                     "gradient clipping read p.grad and go wrong. Divide the gradients by the "
                                     "world size")
                    return at + (f"the parameters are right, but {name}.grad differs from the global batch's "
                                 f"gradient by up to {(g - want).abs().max().item():.3g}")
                if not isinstance(got, float):
                    return at + f"returned {type(got).__name__}, not the loss as a float (loss.item())"
                if not close(got, global_loss.item()):
                    if n > 1 and close(got, local_loss):
                        return at + ("the parameters are right, but the returned loss is this rank's own batch's: "
                                     "all-reduce it and divide by the world size, so every rank reports the "
                                     "global batch's loss")
                    if n > 1 and close(got, n * global_loss.item()):
                        return at + (f"the returned loss is the sum of the {n} ranks' losses: divide it by the "
                                     "world size for the global batch's mean")
                    return at + (f"the returned loss is {got:.6g}, the global batch's is {global_loss.item():.6g}")
            return None

        cases: list[Case] = [(f"{label}, {STEPS} SGD steps", lambda m=make, s=i: case(m, s))
                             for i, (label, make) in enumerate(MODELS)]
        return run_cases(trace, cases)


EXERCISES = [
    Exercise(
        name="fix_summed_loss", number="12.1", lesson=12, notebook="12_debugging_and_pitfalls.ipynb",
        title="find the bug: a data-parallel step that sums instead of averaging", level="medium",
        task=("The docstring holds a data-parallel SGD step that runs, learns, and is wrong: it does not "
              "equal one process on the global batch. Find what, fix it, and return the global batch's loss "
              "on every rank."),
        hint=("Run it in your head on 2 ranks holding the same batch: one process on the doubled batch has "
              "the same gradient; what does the all-reduce give? And whose loss does rank 0 print?"),
        checks=("a linear model and a 2-layer MLP in float64, three SGD steps on 4 samples per rank with "
                "different data on every rank; every parameter compared with one process doing SGD on all "
                "ranks' batches concatenated, every p.grad with that global batch's gradient, and the "
                "returned loss with that global batch's loss"),
        worker=fix_summed_loss_worker),
]
