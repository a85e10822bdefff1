"""Exercise 3.1, reference solution: start ranks with ``multiprocessing`` alone, results by rank.

The start method is asked for explicitly: ``spawn`` (a fresh interpreter) is safe with
threads and CUDA, where ``fork``, the default on Linux up to Python 3.13, copies a parent
that may hold locks of other threads or an initialised CUDA context. A spawned child
imports the target by module and name, so ``run_rank`` lives at the top level of this
file. A process cannot return a value to its parent: each child puts ``(rank, ok,
result or traceback)`` on one queue, and the parent files them by rank, whatever order
they arrive in. The parent never waits blindly: it polls the queue with a deadline,
looks at the exit codes of the children still owing a result (``os._exit(3)`` leaves no
exception to send), and whatever happens stops and joins every child in ``finally``.
"""

from __future__ import annotations

import multiprocessing
import queue
import time
import traceback
from collections.abc import Callable
from typing import Any


def run_rank(fn: Callable[..., Any], rank: int, world_size: int, args: tuple, results: Any) -> None:
    """In the child: run ``fn`` and send back its result, or the traceback of its exception."""
    try:
        results.put((rank, True, fn(rank, world_size, *args)))
    except BaseException:
        results.put((rank, False, traceback.format_exc()))


def launch_ranks(fn: Callable[..., Any], world_size: int, args: tuple = (), timeout: float = 60.0) -> list:
    """Run ``fn(rank, world_size, *args)`` in ``world_size`` new processes; return the results by rank.

    Use ``multiprocessing`` only (not ``torch.multiprocessing`` nor ``ddp_tutorial.launch``),
    with a start method that is safe with threads and CUDA: ``"spawn"`` or ``"forkserver"``,
    never ``"fork"`` (nor the default, which is fork on Linux up to Python 3.13). ``fn`` is a
    module-level function, so a child can import it; anything else a child runs must be
    module-level in this file too. All ranks run at once. The list returned has one result
    per rank, in rank order (``result[r]`` is rank r's), whatever order the ranks finish in.
    A rank that raises, or whose process exits with a non-zero code, makes ``launch_ranks``
    raise an exception whose message names the rank ("rank 1 ..."). When ``timeout`` seconds
    pass before every rank has returned, raise ``TimeoutError``. Whatever happens, no child
    is left running when ``launch_ranks`` returns or raises: stop the ones still running
    (``terminate()`` or ``kill()``) and ``join()`` every child.
    """
    ctx = multiprocessing.get_context("spawn")  # explicit: never a fork of this process
    results = ctx.Queue()
    procs = [ctx.Process(target=run_rank, args=(fn, rank, world_size, args, results))
             for rank in range(world_size)]
    by_rank: dict[int, Any] = {}
    deadline = time.monotonic() + timeout
    try:
        for p in procs:
            p.start()
        while len(by_rank) < world_size:
            try:
                rank, ok, result = results.get(timeout=0.05)
            except queue.Empty:
                failed = [(r, p.exitcode) for r, p in enumerate(procs) if r not in by_rank and p.exitcode]
                if failed:
                    rank, code = failed[0]
                    raise RuntimeError(f"rank {rank} exited with code {code} before returning a result")
                if time.monotonic() > deadline:
                    late = [r for r in range(world_size) if r not in by_rank]
                    raise TimeoutError(f"ranks {late} still running after {timeout:g} s") from None
                continue
            if not ok:
                raise RuntimeError(f"rank {rank} raised:\n{result}")
            by_rank[rank] = result
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
            if p.pid is not None:  # never started: nothing to join
                p.join()
    return [by_rank[rank] for rank in range(world_size)]
