"""Lesson 03's exercise: start ranks with ``multiprocessing`` alone (``launch_ranks``).

Not a distributed check: one checker rank calls the learner's launcher on the small
workers of ``launch_targets`` (copied beside an importable copy of the learner's file, so
a spawned child imports neither torch nor the course) and compares what it returns with
those workers called directly here. The workers record what each child saw: whether it
was forked from this process (it sees a change made here after the import), its pid (so
a child left running is found). ``multiprocessing.get_context`` calls are recorded to
name the start method asked for; ``torch.multiprocessing`` and ``ddp_tutorial.launch``
are refused, imported or called.
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ddp_tutorial.exercises.checks.launching import (
    GRACE,
    TARGETS,
    call_with_deadline,
    importable,
    learner_module,
    refused_launchers,
    start_method,
    stop_all,
)
from ddp_tutorial.exercises.exercise import Exercise
from ddp_tutorial.exercises.harness import Report, run_cases
from ddp_tutorial.exercises.recording import recording
from ddp_tutorial.exercises.tracing import NotAllowed, traced


def launch_ranks_worker(rank: int, world_size: int, source: str, function: str, trace_dir: str) -> Report:
    """Run the learner's launcher on each of ``launch_targets``' workers, in this process."""
    folder = Path(trace_dir) / "importable"
    folder.mkdir()
    targets = importable(TARGETS, folder, "checked_launch_targets")
    targets.MARK = targets.CHANGED  # a forked child sees this; a spawned one imports the file afresh
    targets.CHECKER_PID = os.getpid()
    # This rank inherited launch.spawn's forkserver as its default start method; a learner's
    # notebook or script has the platform's (fork on Linux up to Python 3.13): check with that.
    multiprocessing.set_start_method(None, force=True)
    counter = itertools.count()
    with traced(rank, trace_dir) as trace, refused_launchers(), \
            recording(trace, {"multiprocessing.get_context": ["multiprocessing:get_context"]}) as calls:
        fn = getattr(learner_module(source, folder), function, None)
        if not callable(fn):
            raise AttributeError(f"{Path(source).name} defines no function {function}() (the checker calls it)")

        def launched(worker: Callable[..., Any], n: int, timeout: float) -> tuple[str, Any, dict[int, dict], str | None]:
            """Call the launcher; what it did, the facts each rank recorded, and a problem seen in them."""
            run_dir = folder / f"run{next(counter)}"
            run_dir.mkdir()
            what = f"launch_ranks({worker.__name__}, {n}, args=(folder,), timeout={timeout:g})"
            trace.log(f"> {what}")  # not trace.logged: the get_context calls inside are the learner's own
            outcome, value = call_with_deadline(fn, worker, n, (str(run_dir),), timeout=timeout)
            trace.log(f"< {what}")
            seen = targets.facts(str(run_dir), n)
            problem = None
            if any(f["pid"] == os.getpid() for f in seen.values()):
                problem = (f"{what} ran the worker in the calling process itself: start {n} new processes "
                           "(ctx.Process(...).start()), one per rank")
            elif any(f["mark"] == targets.CHANGED for f in seen.values()):
                problem = (f"{what} forked its children ({start_method(calls)}): a forked child is a copy of "
                           "the parent, with the locks its other threads held and its CUDA state, so it may "
                           "hang or fail to use a GPU. Ask for a safe start method: ctx = "
                           "multiprocessing.get_context(\"spawn\") (or \"forkserver\"), then ctx.Process, "
                           "ctx.Queue")
            if outcome == "hung":
                problem = problem or (f"{what} had not returned {GRACE:g} s after its timeout: wait with a deadline "
                                      "(join(timeout=...), queue.get(timeout=...)), then stop the children "
                                      "still running and raise TimeoutError")
                stop_all([f["pid"] for f in seen.values()])
            return outcome, value, seen, problem

        def by_rank(n: int) -> str | None:
            outcome, value, seen, problem = launched(targets.finish_in_reverse, n, 10.0)
            if problem:
                return problem
            what = f"launch_ranks(finish_in_reverse, {n}, ...)"
            if outcome == "raised":
                return str(value) if isinstance(value, NotAllowed) else (
                    f"{what} raised {type(value).__name__}: {value}, though every rank returns")
            want = [targets.finish_in_reverse(r, n, "", ordered=False) for r in range(n)]  # the workers, called here
            if value == want:
                return None
            if isinstance(value, list) and n > 1 and value == want[::-1]:
                return (f"{what} returned {value}, expected {want}: the results in the order the ranks finished "
                        "(here the highest rank first), not by rank. Send each result with its rank and put "
                        "it at its place: results[rank] = value")
            if isinstance(value, list) and sorted(map(repr, value)) == sorted(map(repr, want)):
                return f"{what} returned {value}, expected {want}: the right results, in the wrong order: by rank"
            if len(seen) < n:
                return f"{what}: only ranks {sorted(seen)} ran the worker; start {n} processes, ranks 0 to {n - 1}"
            return f"{what} returned {value!r}, expected {want} (rank r's result at index r)"

        def failing(worker: Callable[..., Any], how: str) -> Callable[[], str | None]:
            def run() -> str | None:
                outcome, value, seen, problem = launched(worker, 2, 6.0)
                if problem:
                    return problem
                what = f"launch_ranks({worker.__name__}, 2, ...)"
                if outcome == "returned":
                    return (f"{what} returned {value!r} although rank 1 {how}: a failed rank must not go "
                            "unnoticed (no partial results, no None): raise an error naming the rank")
                if isinstance(value, TimeoutError):
                    return (f"{what} waited until its timeout although rank 1 {how} at once: a rank that "
                            "failed sends no result; look at the exit codes of the children still owing one "
                            "(p.exitcode, non-zero) while you wait, and raise naming the rank")
                if "rank 1" not in str(value).lower():
                    return (f"{what} raised {type(value).__name__}: {str(value)[:200]!r}, which does not "
                            f"name the rank: rank 1 {how}, say \"rank 1\" in the message")
                return None
            return run

        def hanging() -> str | None:
            outcome, value, seen, problem = launched(targets.hangs_on_rank_1, 2, 1.0)
            what = "launch_ranks(hangs_on_rank_1, 2, ..., timeout=1)"
            pids = [f["pid"] for f in seen.values()]
            try:
                if problem:
                    return problem
                if outcome == "returned":
                    return f"{what} returned {value!r} although rank 1 was still running: raise TimeoutError"
                if not isinstance(value, TimeoutError):
                    kind = type(value).__qualname__ if type(value).__module__ == "builtins" else \
                        f"{type(value).__module__}.{type(value).__qualname__}"
                    return (f"{what} raised {kind}: {value}; expected the built-in TimeoutError "
                            "(multiprocessing.TimeoutError is another class)")
                deadline = time.monotonic() + 2.0  # a child sent SIGTERM or SIGKILL ends within moments
                while True:
                    states = {r: targets.state(f["pid"]) for r, f in seen.items()}
                    if "running" not in states.values() or time.monotonic() >= deadline:
                        break
                    time.sleep(0.02)
                running = [r for r, s in states.items() if s == "running"]
                left = [r for r, s in states.items() if s == "zombie"]
                if running:
                    return (f"{what} raised TimeoutError but left rank {running[0]}'s process running: "
                            "terminate() or kill() every child still alive, then join() it")
                if left:
                    return (f"{what}: rank {left[0]}'s process ended but was never joined (a zombie until "
                            "joined): join() every child, after terminate() or kill() for those still running")
                return None
            finally:
                stop_all(pids)

        cases = [("results by rank, 3 ranks finishing highest first", lambda: by_rank(3)),
                 ("one rank", lambda: by_rank(1)),
                 ("rank 1 raises ValueError", failing(targets.fails_on_rank_1, "raised ValueError")),
                 ("rank 1 exits with code 3", failing(targets.exits_on_rank_1, "exited with code 3")),
                 ("rank 1 hangs, timeout 1 s", hanging)]
        return run_cases(trace, cases)


EXERCISES = [
    Exercise(
        name="launch_ranks", number="3.1", lesson=3, notebook="03_start_methods.ipynb",
        title="start ranks with multiprocessing alone", level="medium",
        task=("Write the launcher the course's launch.spawn stands for: start world_size processes with a "
              "safe start method, run fn(rank, world_size, *args) in each, return the results by rank, "
              "name the rank that failed, and stop every child at a timeout."),
        hint=("A child cannot return to its parent: give each one a queue (or a pipe) to send (rank, "
              "result) through, from a small module-level function of your file that calls fn. Start them "
              "from multiprocessing.get_context(\"spawn\"), not from the default."),
        more_hints=(
            "The parent waits with a deadline: results.get(timeout=0.05) in a loop until every rank has "
            "answered. When nothing comes, look at the children still owing a result: p.exitcode not in "
            "(None, 0) means that rank died (an exception caught in the child can be sent as a message "
            "instead of a result). Past the deadline: TimeoutError.",
            "Put the clean-up in try/finally, so it runs on success, failure and timeout alike: for p in "
            "procs: if p.is_alive(): p.kill(); then p.join(). Build the answer as [by_rank[r] for r in "
            "range(world_size)], never in arrival order.",
        ),
        checks=("in one process, on small workers the checker gives it, compared with those workers called "
                "directly: 3 ranks finishing highest rank first (results must come back by rank), 1 rank, "
                "rank 1 raising, rank 1 exiting with code 3 (an error naming rank 1), rank 1 hanging with "
                "timeout=1 (TimeoutError, and no child left running). Each child reports whether it was "
                "forked; torch.multiprocessing and ddp_tutorial.launch are refused"),
        worker=launch_ranks_worker, world_sizes=(1,), init_process_group=False,
        hang_hint=("launch_ranks did not return: wait for the results with a deadline (queue.get(timeout=...), "
                   "join(timeout=...)), then stop the children still running and raise TimeoutError")),
]
