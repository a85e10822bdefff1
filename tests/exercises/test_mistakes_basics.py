"""Exercises of lessons 02-16: each typical wrong answer is diagnosed, each other right answer passes.

The cases live in ``exercise_mistakes*.py``, gathered by ``wrong_answers.py``.
"""

from __future__ import annotations

import pytest
from wrong_answers import ALSO_RIGHT, MISTAKES, check_also_right, check_mistake, of_lessons

pytestmark = pytest.mark.slow  # make test-slow (CI) runs it; make test leaves it out


@pytest.mark.parametrize("mistake", of_lessons(MISTAKES, ladder=False))
def test_a_typical_mistake_is_diagnosed(mistake, tmp_path):
    check_mistake(mistake, tmp_path)


@pytest.mark.parametrize("variant", of_lessons(ALSO_RIGHT, ladder=False))
def test_another_right_answer_passes(variant, tmp_path):
    check_also_right(variant, tmp_path)
