"""Exercises: you write the distributed code, a checker runs it on several ranks and says what is wrong.

In a notebook::

    from ddp_tutorial.exercises import check, show
    show("ring_all_reduce")    # the task, the signature, your file, hint 1, what is checked
    show("ring_all_reduce", hint=2)   # the next hint (the hard exercises have 3: idea to formulas)
    check("ring_all_reduce")   # PASS, or FAIL with the first wrong rank / chunk / parameter

From a shell: ``python -m ddp_tutorial.exercises list | show NAME [--hint K] | check NAME
[--solution | --file PATH] | reset NAME``. Your copies live in ``my_exercises/`` at
the top of the repository (git ignores it), seeded from ``exercises/stubs`` on first
use (``workspace`` says where else). The modules: ``spec`` (one exercise),
``registry`` (all of them), ``checks/`` (one module per lesson: the cases and the
rank-side workers), ``harness``, ``tracing``, ``recording`` and ``watching`` (inside the ranks: calls, groups,
bytes kept, the largest tensor, rows routed), ``checker``
(the parent), ``solutions/`` and ``stubgen`` (the stubs made from the solutions).
"""

from __future__ import annotations

from ddp_tutorial.exercises import workspace
from ddp_tutorial.exercises.checker import CheckResult, check, run_check
from ddp_tutorial.exercises.exercise import Exercise
from ddp_tutorial.exercises.registry import EXERCISES, describe, get

__all__ = ["check", "run_check", "CheckResult", "show", "reset", "learner_file", "EXERCISES", "Exercise", "get"]


def learner_file(name: str) -> str:
    """Your copy of exercise ``name``, as a path to open (created from its stub on first use)."""
    get(name)
    return workspace.shown(workspace.learner_file(name))


def show(name: str, hint: int | None = None) -> None:
    """Print exercise ``name``'s card: task, signature, your file, hint 1, what the checker tests.

    ``hint=k`` prints hint ``k`` instead: 1 is the idea, the last one (3 for the hard
    exercises) the formulas. Try each on paper before asking for the next.
    """
    print(describe(name, workspace.shown(workspace.learner_path(name)), hint=hint))


def reset(name: str) -> str:
    """Replace your copy of exercise ``name`` by its stub (your work is lost); return its path."""
    get(name)
    path = workspace.shown(workspace.reset(name))
    print(f"{path} is the stub again")
    return path
