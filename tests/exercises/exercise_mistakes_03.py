"""Typical wrong answers to exercise 3.1 (``launch_ranks``), the words their diagnosis must contain, and
other right answers.

Each entry, as in ``exercise_mistakes.py``: ``(exercise, source, words, timeout in seconds)``.
"""

from __future__ import annotations

import multiprocessing
import os

from exercise_mistakes import broken

SPAWN = 'ctx = multiprocessing.get_context("spawn")'
CLEAN_UP = """        for p in procs:
            if p.is_alive():
                p.kill()
            if p.pid is not None:  # never started: nothing to join
                p.join()
"""

MISTAKES = {
    "launch_ranks: the fork start method": (
        "launch_ranks", broken("launch_ranks", SPAWN, 'ctx = multiprocessing.get_context("fork")'),
        ["forked its children", "it asked for multiprocessing.get_context('fork')",
         'multiprocessing.get_context("spawn")'], 20),
    "launch_ranks: results in arrival order": (
        "launch_ranks", broken("launch_ranks", "return [by_rank[rank] for rank in range(world_size)]",
                               "return list(by_rank.values())"),
        ["returned [23, 13, 3], expected [3, 13, 23]", "in the order the ranks finished", "results[rank] = value"],
        20),
    "launch_ranks: a rank's exception becomes a None result": (
        "launch_ranks", broken("launch_ranks", 'raise RuntimeError(f"rank {rank} raised:\\n{result}")',
                               "result = None"),
        ["returned [2, None] although rank 1 raised ValueError", "raise an error naming the rank"], 20),
    "launch_ranks: the error does not name the rank": (
        "launch_ranks", broken("launch_ranks", 'raise RuntimeError(f"rank {rank} raised:\\n{result}")',
                               'raise RuntimeError("a child failed")'),
        ["which does not name the rank", 'say "rank 1" in the message'], 20),
    "launch_ranks: a non-zero exit code without an exception goes unnoticed": (
        "launch_ranks", broken("launch_ranks", "if r not in by_rank and p.exitcode]", "if False]"),
        ["waited until its timeout although rank 1 exited with code 3", "p.exitcode"], 30),
    "launch_ranks: no timeout": (
        "launch_ranks", broken("launch_ranks", "deadline = time.monotonic() + timeout", 'deadline = float("inf")'),
        ["launch_ranks(hangs_on_rank_1, 2, args=(folder,), timeout=1) had not returned 5 s after its timeout",
         "raise TimeoutError"], 30),
    "launch_ranks: children left running after the timeout": (
        "launch_ranks", broken("launch_ranks", CLEAN_UP, "        pass\n"),
        ["raised TimeoutError but left rank 1's process running", "terminate() or kill()"], 20),
    "launch_ranks: multiprocessing.TimeoutError instead of the built-in one": (
        "launch_ranks", broken("launch_ranks", "raise TimeoutError(", "raise multiprocessing.TimeoutError("),
        ["raised multiprocessing.context.TimeoutError", "expected the built-in TimeoutError"], 20),
    "launch_ranks: runs the ranks in the calling process": (
        "launch_ranks", broken("launch_ranks", "    ctx = multiprocessing", "    return [fn(r, world_size, *args) "
                               "for r in range(world_size)]\n    ctx = multiprocessing"),
        ["ran the worker in the calling process itself", "start 3 new processes"], 20),
    "launch_ranks: imports torch.multiprocessing": (
        "launch_ranks", broken("launch_ranks", "import multiprocessing\n",
                               "import multiprocessing\n\nimport torch.multiprocessing as mp\n"),
        ["imports torch.multiprocessing", "multiprocessing alone"], 20),
    "launch_ranks: calls torch.multiprocessing.spawn": (
        "launch_ranks", "import torch\n\n\ndef launch_ranks(fn, world_size, args=(), timeout=60.0):\n"
        "    torch.multiprocessing.spawn(fn, args=(world_size, *args), nprocs=world_size)\n",
        ["torch.multiprocessing.spawn is not allowed in this exercise"], 20),
    "launch_ranks: calls the course's launch.spawn": (
        "launch_ranks", "from ddp_tutorial.launch import spawn\n\n\ndef launch_ranks(fn, world_size, args=(), "
        "timeout=60.0):\n    return spawn(fn, world_size, args, timeout=timeout, init_process_group=False)\n",
        ["imports ddp_tutorial.launch", "multiprocessing alone"], 20),
}

if multiprocessing.get_context().get_start_method() == "fork":  # Linux up to Python 3.13
    MISTAKES["launch_ranks: the default start method (fork here)"] = (
        "launch_ranks", broken("launch_ranks", SPAWN, "ctx = multiprocessing.get_context()"),
        ["forked its children", "the default start method, which is fork on Linux up to Python 3.13"], 20)

if os.path.isdir("/proc/self"):  # where a zombie can be told from a running process
    MISTAKES["launch_ranks: stops the children but never joins them"] = (
        "launch_ranks", broken("launch_ranks", CLEAN_UP, """        for p in procs:
            if p.is_alive():
                p.kill()
"""), ["was never joined", "join() every child"], 20)

PIPES = '''import multiprocessing
from multiprocessing.connection import wait


def run_rank(fn, rank, world_size, args, conn):
    try:
        conn.send((True, fn(rank, world_size, *args)))
    except Exception as err:
        conn.send((False, repr(err)))
    conn.close()


def launch_ranks(fn, world_size, args=(), timeout=60.0):
    ctx = multiprocessing.get_context("forkserver")
    pipes = [ctx.Pipe(duplex=False) for _ in range(world_size)]
    procs = [ctx.Process(target=run_rank, args=(fn, r, world_size, args, pipes[r][1])) for r in range(world_size)]
    for p in procs:
        p.start()
    for _, send in pipes:
        send.close()  # the child's copy is what it writes to; EOF once it exits
    results = {}
    try:
        waiting = {pipes[r][0]: r for r in range(world_size)}
        while waiting:
            ready = wait(list(waiting), timeout=timeout)
            if not ready:
                raise TimeoutError(f"ranks {sorted(waiting.values())} timed out")
            for conn in ready:
                rank = waiting.pop(conn)
                try:
                    ok, value = conn.recv()
                except EOFError:
                    procs[rank].join()
                    raise RuntimeError(f"rank {rank} died with exit code {procs[rank].exitcode}") from None
                if not ok:
                    raise RuntimeError(f"rank {rank} raised {value}")
                results[rank] = value
    finally:
        for p in procs:
            p.terminate()
            p.join()
    return [results[r] for r in range(world_size)]
'''

# Right answers other than the reference: (exercise, source, timeout)
ALSO_RIGHT = {
    "launch_ranks: forkserver, one pipe per rank, connection.wait": ("launch_ranks", PIPES, 20),
}
