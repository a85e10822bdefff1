"""The exercises of lessons 11-14: each solution passes, each stub fails fast, typical mistakes are diagnosed."""

from __future__ import annotations

import time

import pytest

from ddp_tutorial.exercises import EXERCISES, run_check, workspace
from ddp_tutorial.exercises.checks import performance, pitfalls, sharding, tensor_parallel
from exercise_mistakes_11_14 import MISTAKES

NAMES = [e.name for module in (pitfalls, performance, sharding, tensor_parallel) for e in module.EXERCISES]


def test_lessons_11_to_14_have_their_exercises():
    assert {EXERCISES[n].lesson for n in NAMES} >= {12, 14}
    for name in NAMES:
        assert EXERCISES[name].number.split(".")[0] == str(EXERCISES[name].lesson)


@pytest.mark.parametrize("name", NAMES)
def test_the_solution_passes(name):
    result = run_check(name, solution=True)
    assert result.passed, result.message
    assert "right on world sizes 1, 2, 3" in result.message


@pytest.mark.parametrize("name", NAMES)
def test_a_fresh_stub_fails_fast_with_the_not_implemented_message(name, tmp_path, monkeypatch):
    monkeypatch.setenv(workspace.FOLDER_ENV, str(tmp_path))
    monkeypatch.setenv(workspace.FRESH_ENV, "1")
    start = time.monotonic()
    result = run_check(name)
    assert time.monotonic() - start < 2
    assert not result.passed
    assert result.message.startswith(f"exercise {EXERCISES[name].number} ({name}): not implemented yet: open ")


@pytest.mark.parametrize("mistake", MISTAKES)
def test_a_typical_mistake_is_diagnosed(mistake, tmp_path):
    name, source, words, timeout = MISTAKES[mistake]
    if name not in NAMES:
        pytest.skip(f"{name} is not an exercise")
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    result = run_check(name, file=path, timeout=timeout)
    assert not result.passed, f"{mistake}: passed"
    for word in words:
        assert word in result.message, f"{mistake}: {word!r} not in: {result.message}"


def test_every_exercise_has_two_mistakes_or_more():
    for name in NAMES:
        assert sum(m[0] == name for m in MISTAKES.values()) >= 2, name
