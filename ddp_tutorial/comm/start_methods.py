"""How Python starts a child process, and the two classic ways to start ranks with it.

Used by ``03_start_methods``. ``multiprocessing`` has three *start methods*:

- ``fork``: ``os.fork()``; the child is a copy of the parent at that moment (its memory,
  the modules it imported, functions typed into a notebook). Nothing is pickled, so the
  target need not be importable. Only the forking thread exists in the child, so locks
  held by the parent's other threads stay locked, and a child of a parent that has
  initialised CUDA cannot use CUDA. The default on Linux up to Python 3.13.
- ``spawn``: a fresh interpreter. It imports the module of the target and unpickles the
  target and its arguments (the function by module and name): safe with threads and
  CUDA, slow (torch is imported again). The default on macOS and Windows;
  ``torch.multiprocessing.spawn`` always uses it.
- ``forkserver``: a fresh, single-threaded server process, started once, forks every
  child. A child is a copy of the server (with the modules it preloaded), not of the
  parent; target and arguments are pickled as with spawn. The default on Linux from
  Python 3.14. ``launch.spawn`` uses it with torch preloaded (``launch.child.context``).

``what_children_see`` starts one child with each method and asks what it inherited;
``launch_with_process`` and ``launch_with_mp_spawn`` start ranks without ``launch.spawn``;
``raw_mp_spawn`` shows what ``torch.multiprocessing.spawn`` does with a notebook's function.

    python -m ddp_tutorial.comm.start_methods    # the start methods, then both launchers, 2 ranks
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import re
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as torch_mp

from ddp_tutorial.env import bound_device, choose_backend, set_device_for
from ddp_tutorial.launch import LOCALHOST, PLAIN_TEXT, free_port
from ddp_tutorial.launch.child import context as launch_context

START_METHODS = ("fork", "spawn", "forkserver")
# Module state: the parent changes it before starting a child. Does the child see the change?
MARK = "as imported"


def report_inheritance(parent_pid: int, results: Any) -> None:
    """Runs in the child: did it inherit the parent's memory, and who started it?"""
    results.put({"sees the parent's change": MARK != "as imported",
                 "child of the parent": os.getppid() == parent_pid})


def what_children_see(methods: tuple[str, ...] = START_METHODS, timeout: float = 60.0) -> dict[str, dict]:
    """Change ``MARK`` here, then start one child with each start method: what each reports."""
    global MARK
    seen = {}
    MARK = "changed by the parent"  # after the import: only a copy of this process can see it
    try:
        for method in [m for m in methods if m in multiprocessing.get_all_start_methods()]:
            # forkserver: the server launch.spawn uses (one per process, torch preloaded)
            ctx = launch_context() if method == "forkserver" else multiprocessing.get_context(method)
            results = ctx.SimpleQueue()
            child = ctx.Process(target=report_inheritance, args=(os.getpid(), results))
            child.start()
            child.join(timeout)
            if child.is_alive():
                child.kill()
                child.join()
            if child.exitcode != 0:
                raise RuntimeError(f"the {method} child exited with code {child.exitcode}")
            seen[method] = results.get()
    finally:
        MARK = "as imported"
    return seen


# ------------------------------------------- starting ranks without launch.spawn


def classic_worker(rank: int, world_size: int, port: int, results: Any) -> None:
    """What each rank runs under ``multiprocessing.Process`` or ``mp.spawn``: set up, work, report."""
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = LOCALHOST, str(port)
    backend = choose_backend(local_world_size=world_size)
    device = set_device_for(rank, backend)  # on GPUs: this rank's GPU, current before init
    dist.init_process_group(backend, rank=rank, world_size=world_size, device_id=bound_device(device))
    try:
        x = torch.tensor([rank + 1.0], device=device)
        dist.all_reduce(x)
        results.put((rank, x.item()))  # a return value would be lost: the parent reads a queue
    finally:
        dist.destroy_process_group()


def launch_with_process(world_size: int = 2, timeout: float = 60.0) -> list:
    """One ``multiprocessing.Process`` per rank, "spawn" start method; results by rank."""
    # Explicitly spawn: the default would fork on Linux up to Python 3.13, a copy of a
    # parent that may already run threads or hold CUDA.
    ctx = multiprocessing.get_context("spawn")
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
                             nprocs=world_size, join=False)  # always the "spawn" start method
    _join(context, timeout)  # mp.spawn(..., join=True) would wait forever on a hang
    return [value for _, value in sorted(results.get() for _ in range(world_size))]


def raw_mp_spawn(fn: Callable[[int, int], Any], nprocs: int = 2, timeout: float = 60.0) -> None:
    """``torch.multiprocessing.spawn(fn)`` with the children's stderr captured.

    For a worker defined in a notebook the children die before ``fn`` runs;
    the error then quotes the error line they printed (03 shows this on purpose).
    """
    spawn_log = logging.getLogger("torch.multiprocessing.spawn")
    level = spawn_log.level
    spawn_log.setLevel(logging.ERROR)  # its "Terminating process <pid>" warning would vary
    with tempfile.TemporaryFile() as log:
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(log.fileno(), 2)  # the children inherit fd 2 while they start
        colors = os.environ.get("PYTHON_COLORS")
        os.environ.update(PLAIN_TEXT)  # the children's tracebacks without colour codes (3.13+)
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
            if colors is None:
                os.environ.pop("PYTHON_COLORS", None)
            else:
                os.environ["PYTHON_COLORS"] = colors
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
    """What a child of each start method sees, then two ranks started by each classic launcher."""
    for method, answer in what_children_see().items():
        copy, parent = answer["sees the parent's change"], answer["child of the parent"]
        print(f"{method:10s} sees the parent's change: {copy!s:5s}  child of this process: {parent}")
    for launcher in (launch_with_process, launch_with_mp_spawn):
        results = launcher(world_size=2, timeout=120)
        print(f"{launcher.__name__:22s} -> results by rank: {results}")
        if results != [3.0, 3.0]:  # each rank all-reduced rank + 1: 1 + 2
            sys.exit(f"{launcher.__name__}: expected [3.0, 3.0], got {results}: FAILED")
    print("both launchers returned the all-reduced sum on every rank: OK")


if __name__ == "__main__":
    main()
