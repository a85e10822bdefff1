"""One exercise: what the learner writes, where it is taught, and how it is checked."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

LEVELS = ("warm-up", "medium", "hard")
SOLUTIONS_PACKAGE = "ddp_tutorial.exercises.solutions"
LEARNER_FOLDER_NAME = "my_exercises"  # in the checkout, or under ~/.ddp_tutorial when installed


@dataclass(frozen=True)
class Exercise:
    """An exercise of the course; ``name`` is also the learner's file name and the function to write.

    ``worker`` runs in every rank as ``worker(rank, world_size, source, function, trace_dir)``:
    it imports ``function`` from the file ``source`` and returns ``harness.run_cases``'s report.
    """

    name: str
    number: str  # "6.1": lesson 06, first exercise; stable when other lessons gain exercises
    lesson: int
    notebook: str  # "06_ring_all_reduce.ipynb"
    title: str
    level: str
    task: str  # the short statement; the solution's docstring (copied into the stub) is the contract
    hint: str  # hint 1: the idea; ``more_hints`` go further, the last one up to the formulas
    checks: str  # what the checker tests, besides the world sizes
    worker: Callable[..., Any]
    world_sizes: tuple[int, ...] = (1, 2, 3)
    init_process_group: bool = True  # False: the learner's function joins the group itself
    hang_hint: str = ("a deadlock: each stuck rank waits for a peer that is itself waiting. Post the "
                      "receive together with the send (isend + irecv, then wait on both), or order "
                      "blocking calls so that every send meets a posted recv")
    more_hints: tuple[str, ...] = ()
    # Parent side, once per check before the world sizes: ``prepare(folder)`` writes what every
    # world size's ranks read (a checkpoint saved on other ranks, say) into ``folder`` and returns
    # the worker's extra arguments, passed after ``trace_dir``.
    prepare: Callable[[str], tuple] | None = None

    def __post_init__(self) -> None:
        if self.level not in LEVELS:
            raise ValueError(f"exercise {self.name}: level must be one of {LEVELS}, got {self.level!r}")
        if not self.notebook.startswith(f"{self.lesson:02d}_"):
            raise ValueError(f"exercise {self.name}: notebook {self.notebook} is not lesson {self.lesson:02d}")

    @property
    def hints(self) -> tuple[str, ...]:
        """The graduated hints, from the idea (1) to the formulas (the last): ``show(name, hint=k)``."""
        return (self.hint, *self.more_hints)

    @property
    def function(self) -> str:
        """The name of the function the learner writes (the exercise's name)."""
        return self.name

    @property
    def file_name(self) -> str:
        return f"{self.name}.py"

    @property
    def solution_module(self) -> str:
        return f"{SOLUTIONS_PACKAGE}.{self.name}"

    def solution(self) -> Callable[..., Any]:
        """The reference implementation (imported on demand)."""
        return getattr(importlib.import_module(self.solution_module), self.function)

    def signature(self) -> str:
        """``name(params) -> result``, as the solution's source spells it."""
        return f"{self.function}{inspect.signature(self.solution())}".replace("'", "")  # string annotations

    def call(self) -> str:
        """``name(params)`` without annotations or defaults: how the checker calls it."""
        params = ", ".join(inspect.signature(self.solution()).parameters)
        return f"{self.function}({params})"

    def not_implemented(self, learner_file: str = f"{LEARNER_FOLDER_NAME}/<name>.py") -> str:
        """What an untouched stub says; ``learner_file`` as the learner should read it.

        A fresh stub is where every learner starts, so the message says so, and what to do next.
        """
        where = learner_file.replace("<name>", self.name)
        return (f"exercise {self.number} ({self.name}): not started yet, as expected for a fresh stub: {where} "
                f"still raises NotImplementedError. Next: write {self.function}() there (its docstring is the "
                f"contract, lesson {self.notebook} explains it, show({self.name!r}) gives hints), then check again")

    def still_raises(self, learner_file: str) -> str:
        """What a stub with code added above its ``raise NotImplementedError`` line says."""
        return (f"exercise {self.number} ({self.name}): {learner_file} still raises NotImplementedError (the "
                "stub's last line): delete that line once your code is in place, then check again")
