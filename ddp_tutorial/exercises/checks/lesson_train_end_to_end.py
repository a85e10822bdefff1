"""Lesson 11's exercise: all-rank evaluation, checked against one process scoring everything.

The test set is small and seeded (a classifier with batch norm and dropout on random
features, float64, its running statistics far from a batch's own, so that scoring in
training mode gives other numbers); rank r scores ``data.shard_indices``'s unpadded strided
shard, batches of 3. The learner's sums must equal the (loss sum, correct, count) one
process computes in eval mode over the whole set, on every rank: data set sizes that divide
evenly, that do not, and that leave a rank empty. Recorded too: that the model runs with
autograd off and on inputs moved to ``device`` (``tracing.moves``), which a CPU run could
not tell from the numbers.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from ddp_tutorial.env import rank_device
from ddp_tutorial.exercises.exercise import Exercise
from ddp_tutorial.exercises.harness import Case, Report, load_function, run_cases
from ddp_tutorial.exercises.tracing import moves, traced
from ddp_tutorial.training.data import shard_indices

SIZES = [12, 10, 2]  # even on 1-3 ranks, uneven, fewer samples than ranks
BATCH = 3


def test_set(n: int) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """The same model (in training mode, as after a training epoch) and samples on every rank."""
    torch.manual_seed(n)
    model = nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.ReLU(), nn.Dropout(0.5), nn.Linear(6, 3)).double()
    with torch.no_grad():  # what training left: statistics unlike any one batch's
        model[1].running_mean.uniform_(-2.0, 2.0)
        model[1].running_var.uniform_(0.2, 3.0)
    model.train()
    return model, torch.randn(n, 4, dtype=torch.float64), torch.randint(0, 3, (n,))


@torch.no_grad()
def one_process(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> list[float]:
    """(loss sum, correct, count) of one process scoring everything in eval mode, no communication."""
    model = copy.deepcopy(model).eval()
    logits = model(x)
    return [F.cross_entropy(logits, y, reduction="sum").item(), float((logits.argmax(1) == y).sum()), float(len(y))]


def diagnose(got: list[float], want: list[float], mine: list[float], world_size: int) -> str:
    """Which of the three sums is wrong, and the likely mistake."""
    text = (f"got (loss sum, correct, count) = ({got[0]:.6g}, {got[1]:g}, {got[2]:g}); one process scoring "
            f"all {int(want[2])} samples gets ({want[0]:.6g}, {want[1]:g}, {want[2]:g}).")
    close = lambda a, b: all(abs(u - v) <= 1e-9 * max(1.0, abs(v)) for u, v in zip(a, b))  # noqa: E731  (a one-line helper, read beside its only use)
    if world_size > 1 and close(got, mine) and not close(mine, want):
        return text + (" These are this rank's own sums: all_reduce them (SUM) so that every rank has the "
                       "whole test set's totals")
    if world_size > 1 and close(got, [w / world_size for w in want]):
        return text + (f" That is the total divided by {world_size}: the sums were averaged over the ranks "
                       "(ReduceOp.AVG or / world_size) instead of summed; all_reduce with SUM, divide only "
                       "at the end (loss_sum / count)")
    if abs(got[2] - want[2]) > 0.5:
        return text + " The count is wrong: add len(y) of every batch, then sum over the ranks"
    if abs(got[0] - want[0]) > 1e-9 * max(1.0, abs(want[0])) and abs(got[1] - want[1]) < 0.5:
        return text + (" Only the loss sum is wrong: add F.cross_entropy(logits, y, reduction=\"sum\") per "
                       "batch (the default reduction is the mean)")
    return text + " Score each batch, add the three sums up, then one all_reduce (SUM)"


def how_it_ran(seen: list[tuple[bool, bool, bool]], device: torch.device) -> str | None:
    """Eval mode, autograd off, inputs moved to ``device`` (``seen``: per forward, (training, grad on, moved))."""
    if any(training for training, _, _ in seen):
        return ("the model ran in training mode: call model.eval() before scoring, or dropout "
                "drops units at random and batch norm uses each batch's own statistics (and updates its "
                "running ones) while you score")
    if any(grad for _, grad, _ in seen):
        return ("the model ran with autograd on: wrap the scoring in torch.no_grad() (or "
                "torch.inference_mode()), or every batch keeps its graph alive for a backward that never comes")
    if not all(moved for _, _, moved in seen):
        return (f"a batch went into the model without being moved to device ({device}): x.to(device) and "
                "y.to(device) first (here the device is the CPU, where it makes no difference; on a GPU rank "
                "the model's weights are on its GPU and a CPU batch fails)")
    return None


def evaluate_shards_worker(rank: int, world_size: int, source: str, function: str, trace_dir: str) -> Report:
    """Every size in ``SIZES``: the three sums on this rank compared with one process's."""
    with traced(rank, trace_dir) as trace:
        fn = load_function(source, function)

        def case(n: int) -> str | None:
            model, x, y = test_set(n)
            want = one_process(model, x, y)
            mine_idx = shard_indices(n, rank, world_size)
            mine = one_process(model, x[mine_idx], y[mine_idx]) if mine_idx else [0.0, 0.0, 0.0]
            batches = [(x[mine_idx[i:i + BATCH]], y[mine_idx[i:i + BATCH]]) for i in range(0, len(mine_idx), BATCH)]
            scored = copy.deepcopy(model).to(rank_device())
            seen: list[tuple[bool, bool, bool]] = []
            with moves() as moved:
                scored.register_forward_pre_hook(lambda module, args: seen.append(
                    (any(m.training for m in module.modules()), torch.is_grad_enabled(),
                     moved.moved(args[0], rank_device()))))
                out = fn(scored, batches, rank_device())  # a GPU rank's own device
            try:
                got = [float(v) for v in (out.tolist() if isinstance(out, torch.Tensor) else out)]
            except (TypeError, ValueError):
                got = []
            if len(got) != 3:
                return f"{function} returned {type(out).__name__}, not three numbers (loss sum, correct, count)"
            if (all(abs(g - w) <= 1e-9 * max(1.0, abs(w)) for g, w in zip(got[:1], want[:1]))
                    and got[1:] == want[1:]):
                return how_it_ran(seen, rank_device())
            return how_it_ran(seen, rank_device()) or diagnose(got, want, mine, world_size)

        cases: list[Case] = [(f"{n} test samples, batches of {BATCH}", lambda n=n: case(n)) for n in SIZES]
        return run_cases(trace, cases)


EXERCISES = [
    Exercise(
        name="evaluate_shards", number="11.1", lesson=11, notebook="11_train_end_to_end.ipynb",
        title="all-rank evaluation: score your shard, all-reduce the sums", level="medium",
        task=("Score this rank's shard of the test set, (loss sum, correct, count), and all-reduce the "
              "three sums so that every rank returns the totals one process scoring everything would get."),
        hint=("F.cross_entropy(logits, y, reduction='sum'); (logits.argmax(1) == y).sum(); len(y). One "
              "float64 tensor of 3 on device, then dist.all_reduce(totals): SUM, not AVG."),
        checks=("12, 10 and 2 samples (even, uneven, a rank with an empty shard), strided shards in batches "
                "of 3, a model with batch norm and dropout handed over in training mode; the three sums on "
                "every rank compared with one process scoring all samples in eval mode (loss to 1e-9, "
                "correct and count exactly); eval mode, autograd off and every batch moved to device"),
        worker=evaluate_shards_worker),
]
