"""The typical wrong answers and the other right answers of every exercise, for the tests beside this file.

One module per group of lessons (``exercise_mistakes*.py``). The checks are split over two test
files, the basics (lessons 02-16) and the LLM-scale ladder (17 on), so that pytest-xdist's
``--dist loadfile`` runs them on two workers at once: together they are the slowest file.
"""

from __future__ import annotations

import importlib
from pathlib import Path

from ddp_tutorial.exercises import EXERCISES, run_check

MODULES = [importlib.import_module(path.stem) for path in sorted(Path(__file__).parent.glob("exercise_mistakes*.py"))]
# name -> (exercise, source, words, timeout)
MISTAKES = {name: mistake for module in MODULES for name, mistake in module.MISTAKES.items()}
# Right answers other than the reference (each must pass): name -> (exercise, source, timeout)
ALSO_RIGHT = {name: right for module in MODULES for name, right in getattr(module, "ALSO_RIGHT", {}).items()}
LADDER = 17  # the first lesson of the LLM-scale ladder


def of_lessons(cases: dict, *, ladder: bool) -> list[str]:
    """The names of ``cases`` whose exercise belongs to the ladder (``ladder=True``) or before it."""
    return [name for name, case in cases.items() if (EXERCISES[case[0]].lesson >= LADDER) == ladder]


def check_mistake(mistake: str, folder: Path) -> None:
    """The wrong answer ``mistake`` fails, and the diagnosis says each of its words."""
    name, source, words, timeout = MISTAKES[mistake]
    path = folder / f"{name}.py"
    path.write_text(source)
    result = run_check(name, file=path, timeout=timeout)
    assert not result.passed, f"{mistake}: passed"
    for word in words:
        assert word in result.message, f"{mistake}: {word!r} not in: {result.message}"


def check_also_right(variant: str, folder: Path) -> None:
    """The other right answer ``variant`` passes."""
    name, source, timeout = ALSO_RIGHT[variant]
    path = folder / f"{name}.py"
    path.write_text(source)
    result = run_check(name, file=path, timeout=timeout)
    assert result.passed, f"{variant}: {result.message}"
