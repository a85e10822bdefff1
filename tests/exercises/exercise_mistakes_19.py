"""Typical wrong answers to lesson 19's exercise, and the words their diagnosis must contain.

Same format as ``exercise_mistakes``: ``(exercise, source, words, timeout in seconds)``.
"""

from __future__ import annotations

from exercise_mistakes import broken

WARMUP = "    warmup = min(num_stages - 1 - stage, num_micro)"

MISTAKES = {
    "GPipe's order: every forward first": (
        "one_f_one_b_order",
        "def one_f_one_b_order(stage, num_stages, num_micro):\n"
        "    return [f'F{i}' for i in range(num_micro)] + [f'B{i}' for i in range(num_micro)]\n",
        ["world of 1", "stage 0 holds 2 micro-batches' activations", "at most p - s = 1"], 30),
    "the first stage waits for each backward, the others run GPipe": (
        "one_f_one_b_order",
        "def one_f_one_b_order(stage, num_stages, num_micro):\n"
        "    if stage == 0:\n"
        "        return [a for i in range(num_micro) for a in (f'F{i}', f'B{i}')]\n"
        "    return [f'F{i}' for i in range(num_micro)] + [f'B{i}' for i in range(num_micro)]\n",
        ["world of 2", "wait for each other forever", "stage 0 at step 1 (B0) waits for stage 1's B0"], 30),
    "no warm-up: a forward and its backward in turn on every stage": (
        "one_f_one_b_order",
        "def one_f_one_b_order(stage, num_stages, num_micro):\n"
        "    return [a for i in range(num_micro) for a in (f'F{i}', f'B{i}')]\n",
        ["world of 2", "safe, but slow", "1F1B takes 9"], 30),
    "a warm-up one forward too long": (
        "one_f_one_b_order", broken("one_f_one_b_order", WARMUP, WARMUP.replace("- 1 - stage", "- stage")),
        ["world of 1", "stage 0 holds 2 micro-batches' activations"], 30),
    "a warm-up not capped at the number of micro-batches": (
        "one_f_one_b_order", broken("one_f_one_b_order", WARMUP, "    warmup = num_stages - 1 - stage"),
        ["world of 3", "1 micro-batches on 3 stages", "cap the warm-up at m: min(p - 1 - s, m)"], 30),
}
