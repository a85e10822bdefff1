"""Typical wrong answers to lesson 17's exercise (ZeRO-3 linear layer), and the words their diagnosis must contain.

Same format as ``exercise_mistakes``: ``(exercise, source, words, timeout in seconds)``.
"""

from __future__ import annotations

from exercise_mistakes import broken

SCATTER = "        reduce_scatter_single(grad_shard, padded)  # my slice, summed over the ranks\n"

MISTAKES = {
    "zero3 all-reduces the full gradient, then slices": (
        "zero3_linear", broken("zero3_linear", SCATTER,
                                "        dist.all_reduce(padded)\n"
                                "        s = shard.numel()\n"
                                "        grad_shard = padded[dist.get_rank() * s:(dist.get_rank() + 1) * s]\n"),
        ["world of 1", "the numbers are right, but it all-reduces", "Reduce-scatter it"], 20),
    "zero3 keeps the full weight for backward": (
        "zero3_linear", broken("zero3_linear", "        ctx.save_for_backward(x, shard)  # not the full weight: it is freed when forward returns\n",
                                "        ctx.save_for_backward(x, weight)\n")
        .replace("        x, shard = ctx.saved_tensors\n        weight = gathered_weight(shard, ctx.shape)  # the second all-gather\n",
                 "        x, weight = ctx.saved_tensors\n        shard = ctx.shard\n")
        .replace("        ctx.shape = shape\n", "        ctx.shape, ctx.shard = shape, shard\n"),
        ["backward made no all-gather", "the full weight was kept from forward"], 20),
    "zero3 sums instead of averaging": (
        "zero3_linear", broken("zero3_linear", "return grad_x, grad_shard / n, None", "return grad_x, grad_shard, None"),
        ["world of 2", "2 times the mean", "divide by the world size"], 20),
}
