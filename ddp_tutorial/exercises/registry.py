"""Every exercise of the course, in lesson order, found by name."""

from __future__ import annotations

import difflib
import importlib
import pkgutil
import textwrap

from ddp_tutorial.exercises import checks
from ddp_tutorial.exercises.exercise import Exercise


def _discover() -> dict[str, Exercise]:
    """Every ``checks.lesson_*`` module's ``EXERCISES``, in lesson order: the order is each
    exercise's own ``number`` ("6.1"), so it is written in one place, beside the exercise."""
    found = [e for info in pkgutil.iter_modules(checks.__path__) if info.name.startswith("lesson_")
             for e in importlib.import_module(f"{checks.__name__}.{info.name}").EXERCISES]
    found.sort(key=lambda e: tuple(int(part) for part in e.number.split(".")))
    return {e.name: e for e in found}


EXERCISES: dict[str, Exercise] = _discover()


class UnknownExercise(KeyError):
    """No exercise has that name; the message suggests the closest."""

    def __str__(self) -> str:
        return self.args[0]


def get(name: str) -> Exercise:
    """The exercise called ``name`` (``UnknownExercise`` with a suggestion otherwise)."""
    try:
        return EXERCISES[name]
    except KeyError:
        close = difflib.get_close_matches(name, EXERCISES, n=1)
        maybe = f"; did you mean {close[0]!r}?" if close else ""
        raise UnknownExercise(f"no exercise is called {name!r}{maybe} "
                              "(python -m ddp_tutorial.exercises list)") from None


def listing() -> str:
    """A table of every exercise: number, lesson, level, name, title."""
    rows = [("#", "lesson", "level", "name", "title")]
    rows += [(e.number, e.notebook, e.level, e.name, e.title) for e in EXERCISES.values()]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row[:4], widths)) + "  " + row[4] for row in rows)


class NoSuchHint(ValueError):
    """The exercise has fewer hints than asked for."""


def hint_text(e: Exercise, level: int) -> str:
    """Hint ``level`` (1 = the idea) of ``e``, with where the next one is; NoSuchHint past the last."""
    hints = e.hints
    if not 1 <= level <= len(hints):
        raise NoSuchHint(f"exercise {e.name} has hint{'s 1 to' if len(hints) > 1 else ''} {len(hints)}, not {level}")
    more = (f" (more: show({e.name!r}, hint={level + 1}), or python -m ddp_tutorial.exercises show {e.name} "
            f"--hint {level + 1})") if level < len(hints) else ""
    label = f"hint {level} of {len(hints)}" if len(hints) > 1 else "hint"
    return f"{label}: {hints[level - 1]}{more}"


def describe(name: str, learner_file: str, *, hint: int | None = None) -> str:
    """The exercise card: task, signature, file, hint 1, what the checker tests, how to check.

    With ``hint=k``: the card's header and hint ``k`` only (1 the idea, the last the formulas).
    """
    e = get(name)
    wrap = lambda label, text: textwrap.fill(text, width=100, initial_indent=f"  {label + ': ':<9}",  # noqa: E731  (a one-line helper, read beside its uses)
                                             subsequent_indent=" " * 11, break_long_words=False,
                                             break_on_hyphens=False)
    head = f"Exercise {e.number} ({e.level}), lesson {e.notebook}: {e.title}"
    if hint is not None:
        label, _, text = hint_text(e, hint).partition(": ")
        return "\n".join([head, wrap(label.replace(" of ", "/"), text)])
    first = hint_text(e, 1).partition(": ")[2]
    fields = [("task", e.task), ("write", e.signature()),
              ("in", f"{learner_file} (its docstring is the full contract)"),
              ("hint" if len(e.hints) == 1 else f"hint 1/{len(e.hints)}", first),
              ("checked", f"on world sizes {', '.join(map(str, e.world_sizes))}; {e.checks}."),
              ("check", f"check({e.name!r}) here, or python -m ddp_tutorial.exercises check {e.name}")]
    return "\n".join([head] + [wrap(label, text) for label, text in fields])
