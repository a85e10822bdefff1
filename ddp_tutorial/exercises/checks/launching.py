"""Exercise 3.1's checker, the parts around the learner's call: make files importable, refuse launchers.

``lesson_start_methods`` runs the learner's ``launch_ranks`` in its one checker rank with these:
``importable`` copies a file beside the others under a top-level name, so that a spawned child
imports it by that name (and only it: neither torch nor the course); ``learner_module`` does so
for the learner's file, refusing the imports of the launchers the exercise replaces;
``refused_launchers`` makes those launchers raise if called anyway; ``call_with_deadline`` calls
the learner's launcher in a thread, so one that never returns is reported, not waited for.
"""

from __future__ import annotations

import importlib
import itertools
import os
import shutil
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import torch.multiprocessing as torch_mp

from ddp_tutorial import launch
from ddp_tutorial.exercises import checks
from ddp_tutorial.exercises.harness import SOLUTIONS, imported_module
from ddp_tutorial.exercises.recording import LibraryCall, learner_calls, patched
from ddp_tutorial.exercises.tracing import NotAllowed
from ddp_tutorial.launch import spawner

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
    with patched([(module, attr, refuse(name)) for module, attr, name in places]):
        yield


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
