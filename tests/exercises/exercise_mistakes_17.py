"""Typical wrong answers to the exercises of lesson 17, and the words their diagnosis must contain.

Same format as ``exercise_mistakes``: ``(exercise, source, words, timeout in seconds)``;
``ALSO_RIGHT`` holds other right answers, which must pass.
"""

from __future__ import annotations

from exercise_mistakes import broken

LOOP = "    for block in blocks:\n        x = checkpoint(block, x, use_reentrant=False)  # keeps x; recomputes block(x) in backward\n"
CALL = "checkpoint(block, x, use_reentrant=False)"

MISTAKES = {
    "no checkpoint at all": (
        "checkpointed_forward", broken("checkpointed_forward", LOOP, "    for block in blocks:\n        x = block(x)\n"),
        ["world of 1", "as much as the plain loop", "checkpoint"], 30),
    "one checkpoint around the whole stack": (
        "checkpointed_forward", broken("checkpointed_forward", LOOP,
                                       "    def stack(x):\n        for block in blocks:\n            x = block(x)\n"
                                       "        return x\n    x = checkpoint(stack, x, use_reentrant=False)\n"),
        ["3 blocks", "during backward", "one checkpoint around all 3 blocks", "checkpoint each block"], 30),
    "the reentrant default": (
        "checkpointed_forward", broken("checkpointed_forward", CALL, "checkpoint(block, x, use_reentrant=True)"),
        ["reentrant checkpoint", "use_reentrant=False"], 30),
    "torch's checkpoint_wrapper, reentrant": (
        "checkpointed_forward", broken("checkpointed_forward", LOOP,
                                       "    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (\n"
                                       "        CheckpointImpl, checkpoint_wrapper)\n"
                                       "    for block in blocks:\n"
                                       "        x = checkpoint_wrapper(block, checkpoint_impl=CheckpointImpl.REENTRANT)(x)\n"),
        ["reentrant checkpoint", "CheckpointImpl.REENTRANT"], 30),
    "recompute draws new dropout masks": (
        "checkpointed_forward", broken("checkpointed_forward", CALL,
                                       "checkpoint(block, x, use_reentrant=False, preserve_rng_state=False)"),
        ["differs from the plain loop's", "preserve_rng_state=False"], 30),
    "checkpoint_sequential leaves the last block out": (
        "checkpointed_forward", broken("checkpointed_forward", LOOP,
                                       "    from torch.utils.checkpoint import checkpoint_sequential\n"
                                       "    x = checkpoint_sequential(blocks, len(blocks), x, use_reentrant=False)\n"),
        ["3 blocks", "about 1 of 3 blocks keep all their activations", "checkpoint_sequential"], 30),
}

# Other right answers the checker must accept: name -> (exercise, source, timeout in seconds)
ALSO_RIGHT = {
    "torch's checkpoint_wrapper around each block (torchtitan's way)": (
        "checkpointed_forward", broken("checkpointed_forward", LOOP,
                                       "    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import "
                                       "checkpoint_wrapper\n"
                                       "    for block in blocks:\n        x = checkpoint_wrapper(block)(x)\n"), 30),
    "torch.utils.checkpoint called through its module": (
        "checkpointed_forward", broken("checkpointed_forward", LOOP,
                                       "    import torch.utils.checkpoint as ckpt\n"
                                       "    for block in blocks:\n        x = ckpt.checkpoint(block, x, use_reentrant=False)\n"),
        30),
}
