"""Pitfalls of distributed training, each reproduced for real and bounded by a timeout.

Used by ``11_debugging_and_pitfalls``. Every worker here is a small program with
one classic mistake, plus a switch that applies the fix; ``outcome()`` runs one
through ``launch.spawn`` and describes what happened in one stable line (an
error, a hang stopped by the timeout, or the results). ``hangs.expect`` picks each
demo's backend and says what NCCL does instead. Files and processes:
``ddp_tutorial.strays``; checkpoints: ``checkpoint_pitfalls``; ports and
``--local_rank``: ``launcher_pitfalls``. From a shell:

    python -m ddp_tutorial.pitfalls                  # every demo, symptom then fix
    python -m ddp_tutorial.pitfalls checklist        # the checklist for hangs
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import sys
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist

from ddp_tutorial.ddp_spawn import sampler_orders
from ddp_tutorial.hangs import HANG_CHECKLIST, expect
from ddp_tutorial.env import choose_backend, distributed, rank_info
from ddp_tutorial.launch import WorkerError, WorkerTimeout, spawn

__all__ = ["Outcome", "outcome", "clean_message", "extra_collective", "skips_barrier", "joins", "uneven_inputs",
           "HANG_CHECKLIST", "main"]


# ------------------------------------------------------------ running a demo


@dataclass
class Outcome:
    """What a demo did: ``kind`` is ``"ok"``, ``"error"`` or ``"hang"``."""

    kind: str
    message: str
    results: list | None = None
    ranks: tuple = ()
    seconds: float = 0.0
    log: str = ""

    def __str__(self) -> str:
        if self.kind == "ok":
            return f"ok: {self.results}"
        if self.kind == "hang":
            return f"hang: ranks {list(self.ranks)} still waiting when the timeout ran out (all stopped)"
        return f"error on rank {self.ranks[0]}: {self.message}"

    def log_lines(self, pattern: str) -> list[str]:
        """Lines of the relayed output matching ``pattern``, without timestamps and source paths."""
        return [clean_message(line) for line in self.log.splitlines() if re.search(pattern, line)]


def clean_message(text: str) -> str:
    """Drop what changes between runs and versions: log prefixes, source paths, ports, tensor options."""
    text = re.sub(r"\[rank\d+\]:\[[A-Z]\d{4} [\d:.]+ [^\]]+\] ", "", text)
    text = re.sub(r"\[(enforce fail at )?/[^\]]*\] ", "", text)
    text = re.sub(r"\[?127\.0\.0\.1\]?:\d+", "127.0.0.1:PORT", text)
    text = re.sub(r", TensorDeviceTypes=TensorOptions\((?:[^()]|\([^()]*\))*\)", "", text)
    text = re.sub(r" \(ranks \[[\d, ]+\] failed too[^)]*\)", "", text)  # timing decides if they do
    return re.sub(r"\s+", " ", text).strip()


def outcome(fn: Callable[..., Any], world_size: int = 2, args: Sequence[Any] = (), *,
            timeout: float = 10.0, init_process_group: bool = False) -> Outcome:
    """Run ``fn`` on ``world_size`` ranks with ``launch.spawn``; never raises, never outlives ``timeout``."""
    buffer = io.StringIO()
    start = time.monotonic()
    try:
        with contextlib.redirect_stdout(buffer):
            results = spawn(fn, world_size, args, timeout=timeout,
                            init_process_group=init_process_group)
        found = Outcome("ok", "", results)
    except WorkerTimeout as exc:
        found = Outcome("hang", str(exc), ranks=tuple(exc.ranks))
    except WorkerError as exc:
        found = Outcome("error", clean_message(str(exc).split("\n")[0].split(": ", 1)[-1]), ranks=(exc.rank,))
    found.seconds = time.monotonic() - start
    found.log = buffer.getvalue()
    return found


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
    from torch.distributed.algorithms.join import Join
    from torch.nn.parallel import DistributedDataParallel as DDP

    from ddp_tutorial.models import ToyModel

    import torch._dynamo  # noqa: F401  (DDP imports it on first use: seconds, so before the clock)

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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ddp_tutorial.pitfalls", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command")
    sub.add_parser("demo", help="every demo: symptom, then fix (the default)")
    sub.add_parser("checklist", help="print the checklist for hangs")
    args = parser.parse_args(argv)
    if args.command == "checklist":
        print(HANG_CHECKLIST, end="")
        return 0
    from ddp_tutorial import launcher_pitfalls as launcher
    from ddp_tutorial import pitfalls as m  # under python -m this file is __main__
    from ddp_tutorial.checkpoint_pitfalls import main as checkpoint_demos
    from ddp_tutorial.strays import run_all as run_process_demos

    machine = choose_backend(local_world_size=2)
    for title, name, fn_args in _DEMOS:
        print(f"{title}: {outcome(getattr(m, name), 2, fn_args, timeout=60.0)}", flush=True)
        if machine == "nccl":  # some demos ran on gloo: say what NCCL does instead
            print(f"  on nccl: {expect(name + '_detail' if fn_args == ('DETAIL',) else name, machine).on_nccl}")
    for flag in (False, True):
        orders = [sampler_orders(r, 2, 8, 3, set_epoch=flag) for r in range(2)]
        print(f"set_epoch={flag}: rank 0 sees {orders[0]}")
    checkpoint_demos()
    print(f"port already in use: {launcher.store_on_busy_port()}")
    print(f"port 0 instead: free port found = {launcher.store_on_port_zero()}")
    local_rank = outcome(launcher.local_rank_as_launched, 2, ([],), timeout=60.0)
    print(*local_rank.log_lines("gives"), sep="\n")
    run_process_demos()
    return 0


_DEMOS = [
    ("extra collective", "extra_collective", ()),
    ("extra collective, DETAIL", "extra_collective", ("DETAIL",)),
    ("rank stuck, monitored_barrier", "skips_barrier", (1,)),
    ("wrong world size", "joins", (3,)),
    ("world size from WORLD_SIZE", "joins", (None, 30.0)),
    ("uneven inputs", "uneven_inputs", (False,)),
    ("uneven inputs with Join", "uneven_inputs", (True,)),
]

if __name__ == "__main__":
    sys.exit(main())
