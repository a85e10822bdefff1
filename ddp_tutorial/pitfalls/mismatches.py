"""Collectives that do not match across ranks, and ranks that never meet (``12_debugging_and_pitfalls``).

Each worker is a small program with one classic mistake, plus a switch that applies
the fix; ``harness.outcome`` runs one and says what happened. ``hangs.expect`` picks
each demo's backend: the machine's where the lesson holds on it, gloo where NCCL
would only hang until its watchdog ends the rank.
"""

from __future__ import annotations

import contextlib
import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from ddp_tutorial.env import choose_backend, distributed, rank_info
from ddp_tutorial.pitfalls.hangs import expect
from ddp_tutorial.pitfalls.outcomes import clean_message

__all__ = ["extra_collective", "skips_barrier", "joins", "uneven_inputs"]


def _backend(demo: str) -> str:
    """The backend ``demo``'s ranks use on this machine (``hangs.expect``)."""
    return expect(demo, choose_backend(local_world_size=rank_info().local_world_size)).runs_on


def _join(timeout: float, world_size: int | None = None) -> None:
    """``init_process_group`` from the launcher's environment, with a short timeout so hangs surface."""
    info = rank_info()
    dist.init_process_group(_backend("joins"), timeout=timedelta(seconds=timeout),
                            world_size=info.world_size if world_size is None else world_size, rank=info.rank)


# ------------------------------------------------------ mismatched collectives


def extra_collective(rank: int, world_size: int, debug: str | None = None) -> float | str:
    """Bug: only rank 0 all-reduces a metric, so its next collective meets a different one.

    ``debug="DETAIL"`` (``TORCH_DISTRIBUTED_DEBUG``) checks every collective's
    kind and shapes on all ranks first, and names the mismatch.
    """
    if debug:
        os.environ["TORCH_DISTRIBUTED_DEBUG"] = debug
        dist.set_debug_level_from_env()  # torch read the variable at import; read it again
    with distributed(_backend("extra_collective_detail" if debug else "extra_collective"),
                     timeout=30.0) as (_, device):
        grads = torch.ones(10, device=device)
        try:
            if rank == 0:  # the bug: a collective inside "if rank == 0"
                loss = torch.tensor([0.5], device=device)
                dist.all_reduce(loss)
            dist.all_reduce(grads)
        except RuntimeError as exc:  # DETAIL raises on every rank: return it, rank by rank
            return f"{type(exc).__name__}: {clean_message(str(exc))}"
        return grads.sum().item()


def skips_barrier(rank: int, world_size: int, stuck_rank: int | None = 1, wait: float = 2.0) -> str:
    """One rank is stuck elsewhere (``stuck_rank``); ``monitored_barrier`` names it after ``wait`` s."""
    with distributed(_backend("skips_barrier"), timeout=30.0):
        # monitored_barrier exists on gloo only; on GPUs run it on a gloo side group
        group = None if dist.get_backend() == "gloo" else dist.new_group(backend="gloo")
        if rank == stuck_rank:
            time.sleep(60)  # stands for a rank blocked in data loading, I/O or a deadlock
        dist.monitored_barrier(group, timeout=timedelta(seconds=wait))
        return "passed"


# ------------------------------------------------------- ranks that never meet


def joins(rank: int, world_size: int, claimed_world_size: int | None = None,
          init_timeout: float = 3.0) -> int | str:
    """Bug: a world size typed in the code (``claimed_world_size``) instead of read from the launcher.

    Every rank waits in ``init_process_group`` for ranks that will never start,
    until ``init_timeout``. Fix: ``claimed_world_size=None`` reads ``WORLD_SIZE``.
    """
    try:
        _join(init_timeout, claimed_world_size)
    except RuntimeError as exc:  # every rank times out the same way: return it, rank by rank
        return f"{type(exc).__name__}: {clean_message(str(exc))}"
    try:
        # No rank tears its links down while a peer still connects (gloo on a loaded machine:
        # "connectFullMesh failed ... Connection closed by peer").
        dist.barrier()
        return dist.get_world_size()
    finally:
        dist.destroy_process_group()


def uneven_inputs(rank: int, world_size: int, use_join: bool = False,
                  wait: float = 3.0) -> tuple[int, str]:
    """Rank r has 3 + r batches. Without ``Join`` the rank with more batches waits forever.

    Every collective gives up after ``wait`` seconds, so the hang shows as
    "where each rank was waiting". Returns (batches done, the weights' sum or
    where it hung): with ``Join`` the weights agree on every rank, because ranks
    that ran out of data shadow the others' all-reduces.
    """
    import torch._dynamo  # noqa: F401  (DDP imports it on first use: seconds, so before the clock)
    from torch.distributed.algorithms.join import Join
    from torch.nn.parallel import DistributedDataParallel as DDP

    from ddp_tutorial.models import ToyModel

    with distributed(_backend("uneven_inputs")) as (_, device):
        dist.barrier()
        # A group whose collectives give up after `wait` s: the hang becomes visible.
        group = dist.new_group(timeout=timedelta(seconds=wait))
        torch.manual_seed(0)
        model = DDP(ToyModel().to(device), process_group=group,
                    device_ids=[device.index] if device.type == "cuda" else None)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        batches = [torch.full((4, 10), float(i + rank), device=device) for i in range(3 + rank)]
        done, where = 0, ""
        try:
            with Join([model]) if use_join else contextlib.nullcontext():
                for done, batch in enumerate(batches, 1):
                    where = f"the gradient all-reduce of batch {done}"
                    optimizer.zero_grad()
                    model(batch).square().mean().backward()
                    optimizer.step()
            where = f"the barrier after its {done} batches"
            dist.barrier(group)  # e.g. "wait before rank 0 saves": the others never get here
        except RuntimeError:
            return done - 1 if where.startswith("the gradient") else done, f"stuck in {where}"
        return done, f"weights sum {sum(p.sum().item() for p in model.parameters()):.4f}"
