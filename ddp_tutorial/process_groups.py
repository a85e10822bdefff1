"""Process groups: how ranks find each other, sub-groups, barrier, timeouts, tear-down.

Used by ``02_process_groups``. Every function with the signature
``(rank, world_size, ...)`` is a worker for ``launch.spawn``; most of them set up
the group themselves (``spawn(..., init_process_group=False)``) because setting
it up is the lesson. ``launch_with_process`` and ``launch_with_mp_spawn``
start ranks the two classic ways, without ``launch.spawn``. From a shell:

    torchrun --nproc-per-node=2 -m ddp_tutorial.process_groups
    python -m ddp_tutorial.process_groups          # one process: a world of one
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import re
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as torch_mp

from ddp_tutorial.env import choose_backend, distributed, local_rank, rank_device, set_device_for
from ddp_tutorial.launch import LOCALHOST, free_port

INIT_METHODS = ("env", "tcp", "file")
# What the env:// rendezvous reads when rank and world_size are not passed in.
INIT_VARIABLES = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")


def init_url(method: str, file_path: str | os.PathLike | None = None) -> str:
    """The ``init_method`` URL for ``"env"``, ``"tcp"`` or ``"file"`` (``file`` needs ``file_path``)."""
    if method == "env":
        return "env://"  # MASTER_ADDR, MASTER_PORT (and RANK, WORLD_SIZE) from the environment
    if method == "tcp":
        return f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
    if method == "file":
        if file_path is None:
            raise ValueError("the file:// init method needs a path that every rank can see")
        return Path(file_path).absolute().as_uri()
    raise ValueError(f"unknown init method {method!r}; choose one of {INIT_METHODS}")


def join_with(rank: int, world_size: int, method: str, file_path: str | None = None,
              backend: str | None = None) -> dict:
    """Join the default group with one init method, all-reduce ``rank + 1``, leave."""
    backend = backend or choose_backend(local_world_size=world_size)
    device = set_device_for(local_rank(), backend)
    dist.init_process_group(backend, init_method=init_url(method, file_path),
                            rank=rank, world_size=world_size)
    try:
        x = torch.tensor([rank + 1.0], device=device)
        dist.all_reduce(x)
        return {"rank": dist.get_rank(), "world_size": dist.get_world_size(),
                "backend": dist.get_backend(), "init_method": method, "sum": x.item()}
    finally:
        dist.destroy_process_group()


def what_init_needs(rank: int, world_size: int) -> dict[str, str]:
    """Call ``init_process_group("gloo")`` (env://) with one variable missing at a time.

    Returns ``{variable: first line of the error}``. Nothing connects: each
    attempt fails while reading the environment.
    """
    errors = {}
    for name in INIT_VARIABLES:
        saved = os.environ.pop(name)
        try:
            dist.init_process_group("gloo", timeout=timedelta(seconds=5))
            dist.destroy_process_group()
            errors[name] = "(no error)"
        except (ValueError, RuntimeError) as err:
            errors[name] = str(err).splitlines()[0]
        finally:
            os.environ[name] = saved
    return errors


def subgroup_sums(rank: int, world_size: int) -> dict:
    """Split the world into even and odd ranks with ``new_group``; all-reduce in each."""
    # new_group is collective: every rank creates every group, even ones it is not in.
    evens = dist.new_group(list(range(0, world_size, 2)))
    odds = dist.new_group(list(range(1, world_size, 2))) if world_size > 1 else None
    mine = evens if rank % 2 == 0 else odds
    device = rank_device()  # sub-groups share the default group's backend: NCCL wants GPU tensors
    in_group = torch.tensor([float(rank)], device=device)
    dist.all_reduce(in_group, group=mine)
    in_world = torch.tensor([float(rank)], device=device)
    dist.all_reduce(in_world)  # group=None: the default group, all ranks
    return {"rank": rank, "group": "even" if rank % 2 == 0 else "odd",
            "group_rank": dist.get_rank(mine), "group_size": dist.get_world_size(mine),
            "members": dist.get_process_group_ranks(mine),
            "group_sum": in_group.item(), "world_sum": in_world.item()}


def prepare_then_read(rank: int, world_size: int, path: str, use_barrier: bool,
                      delay: float = 1.0) -> str | None:
    """Rank 0 slowly writes ``path`` (think: downloads a data set); every rank then reads it.

    Returns what the rank found, or None. Without the barrier the other ranks
    look before rank 0 is done.
    """
    target = Path(path)
    if rank == 0:
        time.sleep(delay)  # the slow, do-it-once work
        tmp = target.with_suffix(".tmp")
        tmp.write_text("prepared by rank 0")
        os.replace(tmp, target)  # atomic: a reader sees no file or the whole file
    if use_barrier:
        dist.barrier()  # nobody passes until every rank, rank 0 included, got here
    return target.read_text() if target.exists() else None


def missed_collective(rank: int, world_size: int, timeout: float = 2.0) -> dict:
    """Rank 0 calls ``all_reduce``; the others never do. Rank 0 gives up after ``timeout`` s.

    Uses gloo, which raises on a timeout (NCCL's watchdog aborts the process
    instead). The others wait on the store, not in a collective, until rank 0
    has given up, so rank 0 sees a timeout and not a closed connection.
    """
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                          world_size, is_master=False, timeout=timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size)
    # Every group has its own timeout. Meeting may take a while on a busy machine,
    # so the short limit goes to a second group made for the collective.
    group = dist.new_group(timeout=timedelta(seconds=timeout))
    try:
        if rank != 0:
            store.wait(["rank0_gave_up"])
            return {"rank": rank, "outcome": "never called all_reduce"}
        start = time.monotonic()
        try:
            dist.all_reduce(torch.ones(1), group=group)
            outcome = "all_reduce finished"
        except RuntimeError as err:  # DistBackendError is a RuntimeError
            outcome = f"{type(err).__name__}: timed out" if "Timed out" in str(err) else str(err)
        waited = time.monotonic() - start
        store.set("rank0_gave_up", "1")
        return {"rank": rank, "outcome": outcome, "waited >= timeout": waited >= timeout}
    finally:
        dist.destroy_process_group()


def lifecycle(rank: int, world_size: int) -> list[tuple[str, str]]:
    """``is_initialized`` before ``init_process_group``, after it, after ``destroy_process_group``."""
    steps = [("before init", f"is_initialized={dist.is_initialized()}")]
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    steps.append(("after init", f"is_initialized={dist.is_initialized()}, "
                                f"world_size={dist.get_world_size()}"))
    dist.barrier()  # nobody leaves while another rank still uses the group
    dist.destroy_process_group()
    steps.append(("after destroy", f"is_initialized={dist.is_initialized()}"))
    try:
        dist.all_reduce(torch.ones(1))
        steps.append(("all_reduce after destroy", "worked"))
    except (ValueError, RuntimeError) as err:
        steps.append(("all_reduce after destroy", f"{type(err).__name__}: {str(err).splitlines()[0]}"))
    return steps


# ------------------------------------------- starting ranks without launch.spawn


def classic_worker(rank: int, world_size: int, port: int, results: Any) -> None:
    """What each rank runs under ``multiprocessing.Process`` or ``mp.spawn``: set up, work, report."""
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = LOCALHOST, str(port)
    backend = choose_backend(local_world_size=world_size)
    device = set_device_for(rank, backend)
    dist.init_process_group(backend, rank=rank, world_size=world_size)
    try:
        x = torch.tensor([rank + 1.0], device=device)
        dist.all_reduce(x)
        results.put((rank, x.item()))  # a return value would be lost: the parent reads a queue
    finally:
        dist.destroy_process_group()


def launch_with_process(world_size: int = 2, timeout: float = 60.0) -> list:
    """One ``multiprocessing.Process`` per rank, "spawn" start method; results by rank."""
    ctx = multiprocessing.get_context("spawn")  # fresh interpreters: safe with CUDA and threads
    results = ctx.SimpleQueue()
    port = free_port()  # rank 0 will host the store here; a small race, fine for a lesson
    procs = [ctx.Process(target=classic_worker, args=(rank, world_size, port, results))
             for rank in range(world_size)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    failed = [rank for rank, p in enumerate(procs) if p.exitcode != 0]
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()
    if failed:
        raise RuntimeError(f"ranks {failed} did not finish cleanly within {timeout:g} s")
    return [value for _, value in sorted(results.get() for _ in range(world_size))]


def launch_with_mp_spawn(world_size: int = 2, timeout: float = 60.0) -> list:
    """``torch.multiprocessing.spawn``: calls ``classic_worker(rank, *args)``; results by rank."""
    results = multiprocessing.get_context("spawn").SimpleQueue()
    context = torch_mp.spawn(classic_worker, args=(world_size, free_port(), results),
                             nprocs=world_size, join=False)
    _join(context, timeout)  # mp.spawn(..., join=True) would wait forever on a hang
    return [value for _, value in sorted(results.get() for _ in range(world_size))]


def raw_mp_spawn(fn: Callable[[int, int], Any], nprocs: int = 2, timeout: float = 60.0) -> None:
    """``torch.multiprocessing.spawn(fn)`` with the children's stderr captured.

    For a worker defined in a notebook the children die before ``fn`` runs;
    the error then quotes the error line they printed (02 shows this on purpose).
    """
    spawn_log = logging.getLogger("torch.multiprocessing.spawn")
    level = spawn_log.level
    spawn_log.setLevel(logging.ERROR)  # its "Terminating process <pid>" warning would vary
    with tempfile.TemporaryFile() as log:
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(log.fileno(), 2)  # the children inherit fd 2 while they start
        try:
            context = torch_mp.spawn(fn, args=(nprocs,), nprocs=nprocs, join=False)
            try:
                _join(context, timeout)
                return
            except torch_mp.ProcessExitedException:
                pass  # which child is reported first is down to timing: name none
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            spawn_log.setLevel(level)
        log.seek(0)
        text = log.read().decode(errors="replace")
    # A child stopped by its parent may leave half a traceback: quote a complete error line.
    errors = re.findall(r"^\w+(?:Error|Exception): .*$", text, flags=re.MULTILINE) or ["(no error line)"]
    raise RuntimeError(f"torch.multiprocessing.spawn failed: the children exited with an error; "
                       f"their last words: {errors[-1]}")


def _join(context, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not context.join(timeout=max(0.1, deadline - time.monotonic())):
        if time.monotonic() > deadline:
            for p in context.processes:
                p.kill()
                p.join()
            raise TimeoutError(f"mp.spawn ranks still running after {timeout:g} s")


def main() -> None:
    with distributed() as (info, _device):
        print(f"rank {info.rank} of {info.world_size} on {dist.get_backend()}")
        if info.world_size > 1:
            result = subgroup_sums(info.rank, info.world_size)
            print(f"rank {info.rank}: {result['group']} group {result['members']}, "
                  f"sum {result['group_sum']:.0f}; world sum {result['world_sum']:.0f}")
        dist.barrier()
        if info.is_main:
            print("process groups: OK")


if __name__ == "__main__":
    main()
