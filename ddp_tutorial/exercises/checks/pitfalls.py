"""Lesson 11's exercises (none yet: see issue 15)."""

from __future__ import annotations

from ddp_tutorial.exercises.spec import Exercise

EXERCISES: list[Exercise] = []
