"""Typical wrong answers to the exercises of lessons 12-15, and the words their diagnosis must contain.

Same format as ``exercise_mistakes``: ``(exercise, source, words, timeout in seconds)``;
``ALSO_RIGHT`` holds other right answers, which must pass.
"""

from __future__ import annotations

from exercise_mistakes import HEAD, broken

MISTAKES = {
    "the step as given (sums gradients and keeps its own loss)": (
        "fix_summed_loss", broken("fix_summed_loss", "        p.grad /= n  # the mean over ranks, as DDP: the sum is n times one process's gradient\n", ""),
        ["rank 0 of a world of 2", "step 1", "moved 2 times as far", "summed over the 2 ranks, not averaged"], 20),
    "gradients averaged, the loss still this rank's own": (
        "fix_summed_loss", broken("fix_summed_loss", "    return (total / n).item()", "    return loss.item()"),
        ["world of 2", "the parameters are right, but the returned loss is this rank's own batch's"], 20),
    "loss summed over ranks, not divided": (
        "fix_summed_loss", broken("fix_summed_loss", "    return (total / n).item()", "    return total.item()"),
        ["world of 2", "sum of the 2 ranks' losses"], 20),
    "the step keeps the summed gradients and divides the learning rate": (
        "fix_summed_loss", broken("fix_summed_loss", "        p.grad /= n  # the mean over ranks, as DDP: the sum is n times one process's gradient\n", "")
        .replace("p -= lr * p.grad", "p -= lr / n * p.grad"),
        ["world of 2", "step 1", "the parameters are right, but weight.grad is the sum over the 2 ranks",
         "Divide the gradients by the world size"], 20),
    "busbw uses all-reduce's factor for all-gather": (
        "bus_bandwidth", broken("bus_bandwidth", '"all_gather": lambda n: (n - 1) / n',
                                 '"all_gather": lambda n: 2 * (n - 1) / n'),
        ["bus_bandwidth(3000000000, 0.5, 2, 'all_gather')", "the factor 2 (n - 1) / n", "(n - 1) / n of the full"],
        20),
    "busbw forgets all-reduce's factor 2": (
        "bus_bandwidth", broken("bus_bandwidth", '"all_reduce": lambda n: 2 * (n - 1) / n',
                                 '"all_reduce": lambda n: (n - 1) / n'),
        ["'all_reduce'", "expected 6 = algbw * 1 (nccl-tests)", "reduce-scatter then an all-gather"], 20),
    "busbw in GiB/s": (
        "bus_bandwidth", broken("bus_bandwidth", "nbytes / seconds / 1e9", "nbytes / seconds / 2**30"),
        ["GiB/s", "10**9 bytes"], 20),
    "zero1 forgets the all-gather": (
        "zero1_step", broken("zero1_step", "    all_gather_single(params_flat, mine)", "    pass"),
        ["world of 2", "step 1", "slice 1", "all-gather that brings every rank's updated slice is missing"], 20),
    "zero1 puts its slice at rank * n": (
        "zero1_step", broken("zero1_step", "mine = params_flat[rank * s:(rank + 1) * s]",
                              "mine = params_flat[rank * n:rank * n + s]"),
        ["world of 2", "slice 1 (elements 3..5), which rank 1 updates", "rank * s .. (rank + 1) * s"], 20),
    "zero1 sums instead of averaging": (
        "zero1_step", broken("zero1_step", "    grad.div_(n)  # the mean, as DDP", "    pass"),
        ["world of 2", 'state["exp_avg"] is 2 times', "sum over the 2 ranks, not their mean"], 20),
    "zero1 skips the reduce-scatter": (
        "zero1_step", broken("zero1_step", "reduce_scatter_single(grad, grads_flat)  # my slice, summed over the ranks",
                              "grad.copy_(grads_flat[rank * s:(rank + 1) * s] * n)"),
        ["world of 2", "this rank's own gradient, not the mean over ranks"], 20),
    "zero1 all-reduces the whole gradient, then slices": (
        "zero1_step", broken("zero1_step", "reduce_scatter_single(grad, grads_flat)  # my slice, summed over the ranks",
                              "full = grads_flat.clone()\n        dist.all_reduce(full)\n"
                              "        grad.copy_(full[rank * s:(rank + 1) * s])"),
        ["world of 2", "step 1", "the numbers are right, but its collectives were dist.all_reduce",
         "3 (n - 1) / n", "reduce_scatter_single"], 20),
    "tp adds the bias on every rank": (
        "tp_mlp_forward", broken("tp_mlp_forward", "partial = h @ w2_shard.T", "partial = h @ w2_shard.T + b2")
        .replace("return LeaveParallel.apply(partial) + b2", "return LeaveParallel.apply(partial)"),
        ["rank 0 of a world of 2", "b2 2 times", "add b2 once, after the all-reduce"], 20),
    "tp forgets the all-reduce": (
        "tp_mlp_forward", broken("tp_mlp_forward", "        dist.all_reduce(total)\n", ""),
        ["partial sum", "all-reduce that adds the ranks' partial outputs is missing"], 20),
    "tp averages instead of summing": (
        "tp_mlp_forward", broken("tp_mlp_forward", "dist.all_reduce(total)",
                                  "dist.all_reduce(total, op=dist.ReduceOp.AVG)"),
        ["world of 2", "mean of the ranks' partial outputs", "SUM, not AVG"], 20),
    "tp all-reduces the hidden activations too": (
        "tp_mlp_forward", broken("tp_mlp_forward", "    partial = h @ w2_shard.T",
                                  "    dist.all_reduce(torch.zeros(1))\n    partial = h @ w2_shard.T"),
        ["world of 2", "the output is right, but its forward's collectives were {'all_reduce': 2}",
         "exactly one all-reduce"], 20),
    "tp forward only: a plain dist.all_reduce, no f": (
        "tp_mlp_forward", HEAD + """def tp_mlp_forward(x, w1_shard, b1_shard, w2_shard, b2):
    h = torch.relu(x @ w1_shard.T + b1_shard)
    partial = h @ w2_shard.T
    dist.all_reduce(partial)
    return partial + b2
""", ["world of 2", "the output is right, but x.grad is not the unsplit MLP's", "Megatron's f"], 20),
    "tp without f: x's gradient is this rank's share": (
        "tp_mlp_forward", broken("tp_mlp_forward", "EnterParallel.apply(x) @ w1_shard.T", "x @ w1_shard.T"),
        ["world of 2", "x.grad is not the unsplit MLP's", "Megatron's f"], 20),
    "tp with torch.distributed.nn's all_reduce, whose backward sums again": (
        "tp_mlp_forward", broken("tp_mlp_forward", "return LeaveParallel.apply(partial) + b2",
                                  "from torch.distributed.nn.functional import all_reduce\n"
                                  "    return all_reduce(partial) + b2"),
        ["world of 2", "2 times the unsplit MLP's", "passes its gradient through unchanged"], 20),
    "tp imports the lesson's f and g": (
        "tp_mlp_forward", HEAD + "from ddp_tutorial.tensor_parallel.split_mlp import f, g\n\n\n"
        "def tp_mlp_forward(x, w1_shard, b1_shard, w2_shard, b2):\n"
        "    return g(torch.relu(f(x) @ w1_shard.T + b1_shard) @ w2_shard.T) + b2\n",
        ["NotAllowed", "imports ddp_tutorial.tensor_parallel.split_mlp"], 20),
}

# Other right answers the checker must accept: name -> (exercise, source, timeout in seconds)
ALSO_RIGHT = {
    "zero1 all-gathers with dist.all_gather into views of params_flat": (
        "zero1_step", broken("zero1_step", "all_gather_single(params_flat, mine)",
                              "dist.all_gather(list(params_flat.chunk(n)), mine.clone())"), 20),
    "tp with functional collectives inside f and g": (
        "tp_mlp_forward", broken("tp_mlp_forward", "        dist.all_reduce(grad)\n        return grad",
                                  "        return funcol.all_reduce(grad, \"sum\", dist.group.WORLD)")
        .replace("        total = partial.clone()\n        dist.all_reduce(total)\n        return total",
                 "        return funcol.all_reduce(partial, \"sum\", dist.group.WORLD)")
        .replace("import torch.distributed as dist\n",
                 "import torch.distributed as dist\nimport torch.distributed._functional_collectives as funcol\n"), 20),
    "zero1 all-gathers from a copy (mine.clone())": (
        "zero1_step", broken("zero1_step", "all_gather_single(params_flat, mine)",
                              "all_gather_single(params_flat, mine.clone())"), 20),
}
