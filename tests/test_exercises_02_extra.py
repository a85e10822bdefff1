"""Exercise 2.2 (group_sums): the solution passes, the stub fails fast, typical mistakes are diagnosed.

The general properties of every exercise are in ``tests/test_exercises.py``; this file adds
lesson 02's second exercise and its mistakes.
"""

from __future__ import annotations

import time

import pytest

from ddp_tutorial.exercises import EXERCISES, run_check, workspace
from exercise_mistakes_02 import MISTAKES


def test_lesson_02_has_its_second_exercise():
    e = EXERCISES["group_sums"]
    assert (e.number, e.lesson, e.level, e.world_sizes) == ("2.2", 2, "warm-up", (1, 2, 3, 4))


def test_the_solution_passes():
    result = run_check("group_sums", solution=True)
    assert result.passed, result.message
    assert "right on world sizes 1, 2, 3, 4" in result.message


def test_an_untouched_stub_fails_fast_with_the_not_implemented_message(tmp_path, monkeypatch):
    monkeypatch.setenv(workspace.FOLDER_ENV, str(tmp_path / "mine"))
    monkeypatch.delenv(workspace.FRESH_ENV, raising=False)
    start = time.monotonic()
    result = run_check("group_sums")
    assert time.monotonic() - start < 2
    assert not result.passed
    assert result.message.startswith("exercise 2.2 (group_sums): not implemented yet: open ")


@pytest.mark.parametrize("mistake", MISTAKES)
def test_a_typical_mistake_is_diagnosed(mistake, tmp_path):
    name, source, words, timeout = MISTAKES[mistake]
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    result = run_check(name, file=path, timeout=timeout)
    assert not result.passed, f"{mistake}: passed"
    for word in words:
        assert word in result.message, f"{mistake}: {word!r} not in: {result.message}"
