"""Evaluating under DDP: every rank scores its own shard, one all-reduce adds them up (``11_train_end_to_end``).

Test loss and accuracy are sums over the samples (loss sum, correct, count), so the work
splits: each rank scores the unpadded shard ``data.shard_indices`` gives it and one
``all_reduce`` adds the three sums. The result is what one process scoring everything gets,
it arrives on every rank (so what the ranks decide from it, such as stopping early or
lowering the learning rate, agrees), and each rank does 1/N of the work.

- ``evaluate``: that, over a loader of this rank's shard (``train`` calls it every epoch);
- ``rank0_evaluate``: rank 0 scores everything and broadcasts the sums while the others
  wait: the same numbers with one rank working. Whatever rank 0 runs alone must contain no
  collective; ``rank0_calls_a_collective`` shows the hang when it does;
- ``evaluation_worker``: these side by side with ``DistributedSampler`` shards, which are
  padded by repeating samples (counted twice) or, with ``drop_last=True``, cut short;
- ``state_dicts_worker``: DDP's ``module.`` prefix, the reason to save ``ddp.module.state_dict()``.
"""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Subset

from ddp_tutorial.env import rank_device
from ddp_tutorial.models import build_model
from ddp_tutorial.training.data import digits, shard_indices

__all__ = ["score", "as_metrics", "evaluate", "rank0_evaluate", "evaluation_worker",
           "rank0_calls_a_collective", "state_dicts_worker"]


@torch.no_grad()
def score(model: nn.Module, loader: DataLoader, device: torch.device) -> torch.Tensor:
    """This process's sums over ``loader``: (loss sum, correct, count) in float64. No communication."""
    model.eval()
    totals = torch.zeros(3, dtype=torch.float64, device=device)
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        logits = model(x)
        totals[0] += F.cross_entropy(logits, y, reduction="sum").double()
        totals[1] += (logits.argmax(dim=1) == y).sum()
        totals[2] += len(y)
    return totals


def as_metrics(totals: torch.Tensor) -> dict:
    """(loss sum, correct, count) -> mean loss, accuracy and the number of samples counted."""
    loss_sum, correct, count = totals.tolist()
    return {"test_loss": loss_sum / max(count, 1), "test_acc": correct / max(count, 1), "test_samples": int(count)}


def evaluate(model: nn.Module, loader: DataLoader, device: torch.device,
             group: dist.ProcessGroup | None = None) -> dict:
    """Loss and accuracy over the whole test split: each rank scores its shard, then one all-reduce.

    Every rank of ``group`` must call it, each with its own unpadded shard (``data.make_loaders``).
    Pass the bare model (``ddp.module``), not the DDP wrapper: the wrapper's first forward after a
    training step broadcasts rank 0's buffers (BatchNorm statistics) when the model has any, one
    more collective to keep in step.
    """
    totals = score(model, loader, device)
    if dist.is_initialized():
        dist.all_reduce(totals, group=group)
    return as_metrics(totals)


def rank0_evaluate(model: nn.Module, dataset: Dataset, device: torch.device, batch_size: int = 256) -> dict:
    """Rank 0 scores all of ``dataset`` alone while the others wait in a broadcast for its sums.

    Every rank gets the same numbers as with ``evaluate``, but one rank does all the work, and
    what it runs alone (``score``) calls no collective.
    """
    totals = torch.zeros(3, dtype=torch.float64, device=device)
    if dist.get_rank() == 0:
        totals = score(model, DataLoader(dataset, batch_size=batch_size), device)
    dist.broadcast(totals, src=0)
    return as_metrics(totals)


def evaluation_worker(rank: int, world_size: int, weights: dict | None = None, seed: int = 0,
                      batch_size: int = 64) -> dict:
    """Score a ``SmallCNN`` (``weights``, or the seeded initial ones) on the digits test split four ways.

    Returns, for each way, the metrics this rank received and how many samples it scored itself.
    """
    device = rank_device()
    test = digits(seed).test
    torch.manual_seed(seed)
    model = build_model("cnn", 1, 10).to(device)
    if weights is not None:
        model.load_state_dict(weights)
    shard = Subset(test, shard_indices(len(test), rank, world_size))  # what data.make_loaders uses
    ways = {"every rank its shard, all_reduce": (evaluate(model, DataLoader(shard, batch_size), device),
                                                 len(shard)),
            "rank 0 everything, broadcast": (rank0_evaluate(model, test, device),
                                             len(test) if rank == 0 else 0)}
    for drop_last in (False, True):
        sampler = DistributedSampler(test, num_replicas=world_size, rank=rank, shuffle=False, drop_last=drop_last)
        metrics = evaluate(model, DataLoader(test, batch_size, sampler=sampler), device)
        ways[f"DistributedSampler(drop_last={drop_last})"] = (metrics, len(sampler))
    return {way: {"metrics": metrics, "scored": scored} for way, (metrics, scored) in ways.items()}


def rank0_calls_a_collective(rank: int, world_size: int, wait: float = 3.0, seed: int = 0) -> str:
    """The mistake ``if rank == 0: evaluate(...)`` with an evaluation that all-reduces inside.

    Rank 0 waits in ``evaluate``'s all-reduce for ranks that never call it; they wait in the
    barrier "until rank 0 has evaluated", which rank 0 never reaches. On a group whose timeout
    is ``wait`` seconds, gloo gives up with a ``RuntimeError`` (NCCL's watchdog would abort the
    processes after the timeout, 10 minutes by default). Returns where this rank was stuck.
    """
    device = rank_device()
    group = dist.new_group(timeout=timedelta(seconds=wait))  # so that the hang ends
    test = digits(seed).test
    torch.manual_seed(seed)
    model = build_model("cnn", 1, 10).to(device)
    where = "the barrier, waiting for rank 0"
    try:
        if rank == 0:
            where = "evaluate's all_reduce"
            evaluate(model, DataLoader(test, batch_size=256), device, group=group)
        dist.barrier(group=group)
    except RuntimeError:
        return f"stuck in {where} until the group's timeout"
    return "finished"


def state_dicts_worker(rank: int, world_size: int, seed: int = 0) -> dict:
    """The same weights seen through DDP and without it: ``ddp.state_dict()`` and ``ddp.module.state_dict()``."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    device = rank_device()
    torch.manual_seed(seed)
    model = build_model("cnn", 1, 10).to(device)
    ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    on_cpu = lambda state: {k: v.detach().cpu() for k, v in state.items()}  # noqa: E731  (a one-line helper, read beside its only use)
    return {"ddp.state_dict()": on_cpu(ddp.state_dict()),
            "ddp.module.state_dict()": on_cpu(ddp.module.state_dict())}
