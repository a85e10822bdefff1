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

import importlib
import itertools
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import torch.multiprocessing as torch_mp

from ddp_tutorial import launch
from ddp_tutorial.launch import spawner
from ddp_tutorial.exercises import checks
from ddp_tutorial.exercises.exercise import Exercise
from ddp_tutorial.exercises.harness import SOLUTIONS, Report, imported_module, run_cases
from ddp_tutorial.exercises.recording import LibraryCall, learner_calls, recording
from ddp_tutorial.exercises.tracing import NotAllowed, traced

REFUSED = ("torch.multiprocessing", "ddp_tutorial.launch", "ddp_tutorial.comm.start_methods")
TARGETS = Path(checks.__file__).with_name("launch_targets.py")
GRACE = 5.0  # seconds past its timeout a launcher may take to stop its children
_copies = itertools.count()


def importable(source: Path, folder: Path, name: str) -> ModuleType:
    """``source`` imported as the top-level module ``name`` from ``folder``: children import it too."""
    shutil.copyfile(source, folder / f"{name}.py")
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))  # the children of every start method get this sys.path
    return importlib.import_module(name)


def learner_module(source: str, folder: Path) -> ModuleType:
    """The learner's file, importable by a child under a fresh name (no stale bytecode); refused imports raise."""
    text = Path(source).read_text(encoding="utf-8")
    used = imported_module(text, (SOLUTIONS, *REFUSED))
    if used:
        raise NotAllowed(f"{Path(source).name} imports {used}: the exercise is to start the processes yourself "
                         "with multiprocessing alone (get_context, Process, Queue or Pipe)")
    return importable(Path(source), folder, f"checked_launch_ranks_{os.getpid()}_{next(_copies)}")


@contextmanager
def refused_launchers() -> Iterator[None]:
    """``torch.multiprocessing.spawn``/``start_processes`` and ``launch.spawn`` raise while the block runs."""
    def refuse(name: str) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            raise NotAllowed(f"{name} is not allowed in this exercise: start the processes yourself with "
                             "multiprocessing (get_context, Process, Queue or Pipe)")
        return call

    places = [(torch_mp, "spawn", "torch.multiprocessing.spawn"),
              (torch_mp, "start_processes", "torch.multiprocessing.start_processes"),
              (launch, "spawn", "ddp_tutorial.launch.spawn"), (spawner, "spawn", "ddp_tutorial.launch.spawn")]
    saved = [(module, attr, getattr(module, attr)) for module, attr, _ in places]
    for module, attr, name in places:
        setattr(module, attr, refuse(name))
    try:
        yield
    finally:
        for module, attr, fn in saved:
            setattr(module, attr, fn)


def call_with_deadline(fn: Callable[..., Any], *args: Any, timeout: float) -> tuple[str, Any]:
    """``("returned", value)``, ``("raised", exception)`` or ``("hung", None)`` after ``timeout + GRACE`` s."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["returned"] = fn(*args, timeout=timeout)
        except BaseException as err:  # noqa: BLE001  (the learner's error is what we report)
            box["raised"] = err

    thread = threading.Thread(target=run, daemon=True)  # a launcher that never returns must not hold the check
    thread.start()
    thread.join(timeout + GRACE)
    return next(iter(box.items())) if box else ("hung", None)


def start_method(calls: list[LibraryCall]) -> str:
    """What the learner asked ``multiprocessing.get_context`` for, in words."""
    asked = [c.arguments.get("method") for c in learner_calls(calls, "multiprocessing.get_context")]
    if not asked or asked[-1] is None:
        return "it used the default start method, which is fork on Linux up to Python 3.13"
    return f"it asked for multiprocessing.get_context({asked[-1]!r})"


def stop_all(pids: list[int]) -> None:
    """The checker's own clean-up: no child of a check outlives it, whatever the launcher did."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def launch_ranks_worker(rank: int, world_size: int, source: str, function: str, trace_dir: str) -> Report:
    """Run the learner's launcher on each of ``launch_targets``' workers, in this process."""
    folder = Path(trace_dir) / "importable"
    folder.mkdir()
    targets = importable(TARGETS, folder, "checked_launch_targets")
    targets.MARK = targets.CHANGED  # a forked child sees this; a spawned one imports the file afresh
    counter = itertools.count()
    with traced(rank, trace_dir) as trace, refused_launchers(), \
            recording(trace, {"multiprocessing.get_context": ["multiprocessing:get_context"]}) as calls:
        fn = getattr(learner_module(source, folder), function, None)
        if not callable(fn):
            raise AttributeError(f"{Path(source).name} defines no function {function}() (the checker calls it)")

        def launched(worker: Callable[..., Any], n: int, timeout: float) -> tuple[str, Any, dict[int, dict], str]:
            """Call the launcher; what it did, the facts each rank recorded, and a problem seen in them."""
            run_dir = folder / f"run{next(counter)}"
            run_dir.mkdir()
            what = f"launch_ranks({worker.__name__}, {n}, args=(folder,), timeout={timeout:g})"
            outcome, value = trace.logged(what, call_with_deadline, fn, worker, n, (str(run_dir),), timeout=timeout)
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
            outcome, value, seen, problem = launched(targets.finish_in_reverse, n, 20.0)
            if problem:
                return problem
            what = f"launch_ranks(finish_in_reverse, {n}, ...)"
            if outcome == "raised":
                return f"{what} raised {type(value).__name__}: {value}, though every rank returns"
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
                    return (f"{what} raised {type(value).__name__}: {value}; expected the built-in TimeoutError "
                            "(multiprocessing.TimeoutError is another class)")
                deadline = time.monotonic() + 2.0  # a child sent SIGKILL is gone within moments
                left = [r for r, f in seen.items() if targets.state(f["pid"]) != "gone"]
                while left and time.monotonic() < deadline:
                    time.sleep(0.02)
                    left = [r for r, f in seen.items() if targets.state(f["pid"]) == "running"]
                running = [r for r in left if targets.state(seen[r]["pid"]) == "running"]
                if running:
                    return (f"{what} raised TimeoutError but left rank {running[0]}'s process running: "
                            "terminate() or kill() every child still alive, then join() it")
                if left:
                    return (f"{what} stopped rank {left[0]}'s process but never joined it (a zombie until "
                            "joined): join() every child after terminate() or kill()")
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
