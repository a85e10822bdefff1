"""Exercises 6.1, 8.1, 9.1 and 10.1: the solution passes, the stub fails fast, typical mistakes are diagnosed.

The general properties of every exercise (stubs up to date, the lesson exists) are in
``tests/test_exercises.py``; this file adds the mistakes of lessons 06-10.
"""

from __future__ import annotations

import time

import pytest

from ddp_tutorial.exercises import EXERCISES, run_check, workspace
from exercise_mistakes_06_10 import MISTAKES

NAMES = [name for name, e in EXERCISES.items() if e.lesson in (6, 8, 9, 10)]


def test_lessons_06_to_10_have_their_exercises():
    assert {EXERCISES[n].number for n in NAMES} == {"6.1", "8.1", "9.1", "10.1"}


@pytest.mark.parametrize("name", NAMES)
def test_the_solution_passes(name):
    result = run_check(name, solution=True)
    assert result.passed, result.message
    assert "right on world sizes 1, 2, 3" in result.message


@pytest.mark.parametrize("name", NAMES)
def test_an_untouched_stub_fails_fast_with_the_not_implemented_message(name, tmp_path, monkeypatch):
    monkeypatch.setenv(workspace.FOLDER_ENV, str(tmp_path / "mine"))
    monkeypatch.delenv(workspace.FRESH_ENV, raising=False)
    start = time.monotonic()
    result = run_check(name)
    assert time.monotonic() - start < 2
    assert not result.passed
    assert result.message.startswith(f"exercise {EXERCISES[name].number} ({name}): not implemented yet: open ")


@pytest.mark.parametrize("mistake", MISTAKES)
def test_a_typical_mistake_is_diagnosed(mistake, tmp_path):
    name, source, words, timeout = MISTAKES[mistake]
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    result = run_check(name, file=path, timeout=timeout)
    assert not result.passed, f"{mistake}: passed"
    for word in words:
        assert word in result.message, f"{mistake}: {word!r} not in: {result.message}"


def test_every_exercise_here_has_two_mistakes_or_more():
    for name in NAMES:
        assert sum(m[0] == name for m in MISTAKES.values()) >= 2, name
