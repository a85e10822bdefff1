"""Typical wrong answers to exercise 15.2 (lesson 15: the gradient all-reduce of a dp x tp mesh), and the words
their diagnosis must contain.

Same format as ``exercise_mistakes``: ``(exercise, source, words, timeout in seconds)``; ``ALSO_RIGHT`` holds
other right answers, which must pass. Every layout starts with the 2 x 2 mesh named ``("dp", "tp")``, whose dp
groups are strided: ranks [0, 2] and [1, 3].
"""

from __future__ import annotations

from exercise_mistakes import HEAD, broken

NAME = "dp_grad_average"
GROUP = '    group = mesh.get_group("dp")  # this rank\'s dp group: the ranks that hold the same pieces\n'
REDUCE = "        dist.all_reduce(grad, group=group)  # SUM over the dp copies of this piece\n"
DIVIDE = "        grad.div_(size)  # their mean: the whole global batch's gradient\n"
SIZE = "    size = dist.get_world_size(group)\n"
# Every rank makes every group of the dimension, in the same order, and keeps its own.
BY_HAND = HEAD + '''def dp_grad_average(mesh, grads):
    dim = mesh.mesh_dim_names.index("dp")
    columns = mesh.mesh.movedim(dim, -1).reshape(-1, mesh.mesh.shape[dim]).tolist()
    group = None
    for ranks in columns:
        made = dist.new_group(ranks)
        if dist.get_rank() in ranks:
            group = made
    for grad in grads.values():
        dist.all_reduce(grad, group=group)
        grad.div_(len(columns[0]))
'''

MISTAKES = {
    "dp_grad_average all-reduces on the default (world) group": (
        NAME, broken(NAME, REDUCE, "        dist.all_reduce(grad)\n"),
        ["world of 4", "over all 4 ranks (the default group), not the dp group [0, 2]",
         "adds up the tp ranks' different shards", "numbers are wrong"], 60),
    "dp_grad_average all-reduces over the tp group": (
        NAME, broken(NAME, GROUP, '    group = mesh.get_group("tp")\n'),
        ["over the tp group [0, 1], not the dp group [0, 2]", "different shards", "numbers are wrong"], 60),
    "dp_grad_average builds the dp groups by hand from contiguous ranks": (
        NAME, broken(NAME, GROUP, "    r = dist.get_rank()\n"
                                  "    groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]\n"
                                  "    group = groups[r // 2]\n"),
        ["a group made by hand with new_group, ranks [0, 1] (the tp group's ranks)", "dp group is [0, 2]",
         "strided"], 60),
    "dp_grad_average makes only its own group with new_group": (
        NAME, broken(NAME, GROUP, "    r = dist.get_rank()\n"
                                  "    group = dist.new_group([r % 2, r % 2 + 2])\n"),
        ["ranks asked for different groups", "every rank must call new_group for every group"], 60),
    "dp_grad_average sums without dividing by the dp size": (
        NAME, broken(NAME, DIVIDE, ""),
        ["2 times the whole batch's", "not divided by the dp size (2)"], 60),
    "dp_grad_average divides by the world size": (
        NAME, broken(NAME, SIZE, "    size = dist.get_world_size()\n"),
        ["divided by the world size (4), not by the dp size (2)"], 60),
    "dp_grad_average all-gathers the copies, then averages: right numbers, wrong traffic": (
        NAME, broken(NAME, REDUCE + DIVIDE,
                     "        copies = [torch.empty_like(grad) for _ in range(size)]\n"
                     "        dist.all_gather(copies, grad, group=group)\n"
                     "        grad.copy_(torch.stack(copies).mean(0))\n"),
        ["dist.all_gather over the dp group [0, 2]", "2 times the data received", "numbers happen to be right",
         "use dist.all_reduce"], 60),
    "dp_grad_average also averages the replicated bias over tp: right numbers, extra traffic": (
        NAME, broken(NAME, DIVIDE, DIVIDE + "    bias = grads['net2.bias']\n"
                                            "    dist.all_reduce(bias, group=mesh.get_group('tp'))\n"
                                            "    bias.div_(dist.get_world_size(mesh.get_group('tp')))\n"),
        ["net2.bias ran over the tp group [0, 1]", "already equal", "numbers happen to be right"], 60),
    "dp_grad_average replaces the dict entries instead of writing in place": (
        NAME, broken(NAME, "    for grad in grads.values():\n" + REDUCE + DIVIDE,
                     "    for name, grad in grads.items():\n" + REDUCE + "        grads[name] = grad / size\n"),
        ["was replaced by a new tensor", "in place"], 60),
    "dp_grad_average returns without communicating": (
        NAME, HEAD + "def dp_grad_average(mesh, grads):\n    return None\n",
        ["net1.weight's gradient is unchanged", "not the mean of its dp group"], 60),
}

ALSO_RIGHT = {
    "dp_grad_average with mesh['dp'].get_group()": (
        NAME, broken(NAME, GROUP, '    group = mesh["dp"].get_group()\n'), 60),
    "dp_grad_average with ReduceOp.AVG (gloo and NCCL both have it)": (
        NAME, broken(NAME, REDUCE + DIVIDE, "        dist.all_reduce(grad, op=dist.ReduceOp.AVG, group=group)\n"), 60),
    "dp_grad_average with the dp groups made by hand, every rank making each": (NAME, BY_HAND, 60),
    "dp_grad_average with one flat buffer for all four gradients": (
        NAME, HEAD + '''def dp_grad_average(mesh, grads):
    group = mesh.get_group("dp")
    flat = torch.cat([g.reshape(-1) for g in grads.values()])
    dist.all_reduce(flat, group=group)
    flat /= dist.get_world_size(group)
    for g, piece in zip(grads.values(), flat.split([g.numel() for g in grads.values()])):
        g.copy_(piece.view_as(g))
''', 60),
}
