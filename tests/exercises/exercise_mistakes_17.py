"""Typical wrong answers to the exercises of lesson 17, and the words their diagnosis must contain.

Same format as ``exercise_mistakes``: ``(exercise, source, words, timeout in seconds)``;
``ALSO_RIGHT`` holds other right answers, which must pass.
"""

from __future__ import annotations

from exercise_mistakes import broken

LOOP = "    for block in blocks:\n        x = checkpoint(block, x, use_reentrant=False)  # keeps x; recomputes block(x) in backward\n"

MISTAKES = {
    "no checkpoint at all": (
        "checkpointed_forward", broken("checkpointed_forward", LOOP, "    for block in blocks:\n        x = block(x)\n"),
        ["world of 1", "as much as the plain loop", "never called"], 30),
    "one checkpoint around the whole stack": (
        "checkpointed_forward", broken("checkpointed_forward", LOOP,
                                       "    def stack(x):\n        for block in blocks:\n            x = block(x)\n"
                                       "        return x\n    x = checkpoint(stack, x, use_reentrant=False)\n"),
        ["3 blocks", "one checkpoint around all 3 blocks", "checkpoint each block"], 30),
    "the reentrant default": (
        "checkpointed_forward", broken("checkpointed_forward", "checkpoint(block, x, use_reentrant=False)",
                                       "checkpoint(block, x, use_reentrant=True)"),
        ["without use_reentrant=False"], 30),
    "recompute draws new dropout masks": (
        "checkpointed_forward", broken("checkpointed_forward", "checkpoint(block, x, use_reentrant=False)",
                                       "checkpoint(block, x, use_reentrant=False, preserve_rng_state=False)"),
        ["differs from the plain loop's", "preserve_rng_state=False"], 30),
    "checkpoint_sequential leaves the last block out": (
        "checkpointed_forward", broken("checkpointed_forward", LOOP,
                                       "    from torch.utils.checkpoint import checkpoint_sequential\n"
                                       "    x = checkpoint_sequential(blocks, len(blocks), x, use_reentrant=False)\n"),
        ["checkpoint was called 2 times for 3 blocks", "checkpoint_sequential"], 30),
}
