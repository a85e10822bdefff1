"""Typical wrong answers to exercise 2.2, and the words their diagnosis must contain.

Each entry, as in ``exercise_mistakes.py``: ``(exercise, source, words, timeout in seconds)``.
"""

from __future__ import annotations

from exercise_mistakes import broken

MISTAKES = {
    "group_sums: each rank creates only its own group": (
        "group_sums", broken("group_sums", "    groups = [dist.new_group(ranks) for ranks in parities]  # every rank, every group, same order",
                             "    groups = [dist.new_group(parities[rank % 2])] * 2"),
        ["rank 0", "every rank must call new_group for every group, in the same order"], 10),
    "group_sums: all-reduces in the other parity's group": (
        "group_sums", broken("group_sums", "mine = groups[rank % 2]", "mine = groups[(rank + 1) % len(groups)]"),
        ["rank 0", "rank 0's group sum is 1, expected 4 (ranks [0, 2])"], 10),
}
