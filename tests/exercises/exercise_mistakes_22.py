"""Typical wrong answers to the exercise of lesson 22 (the capstone), and the words their diagnosis must contain.

Same format as ``exercise_mistakes``: ``(exercise, source, words, timeout in seconds)``.
``ALSO_RIGHT`` holds other right answers, which must pass.
"""

from __future__ import annotations

from exercise_mistakes import broken

ASK_THE_OTHERS = """    rank, everyone = dist.get_rank(), [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mesh.get_coordinate())  # every rank's coordinates, asked for
    mine, names = everyone[rank], list(sizes)
    groups = {name: [r for r, c in enumerate(everyone)
                     if all(c[j] == mine[j] for j in range(4) if j != names.index(name))] for name in sizes}
"""
LOOP = """    rank, stride, groups = dist.get_rank(), 1, {}
    for name in reversed(list(sizes)):  # tp first: the fastest digit, stride 1
        digit = rank // stride % sizes[name]
        start = rank - digit * stride  # this rank with its digit of `name` set to 0
        groups[name] = [start + i * stride for i in range(sizes[name])]
        stride *= sizes[name]
"""
ASK_TORCHS_GROUPS = """    groups = {name: dist.get_process_group_ranks(mesh[name].get_group()) for name in sizes}
"""
ASK_THE_MESH_TENSOR = """    where = (mesh.mesh == dist.get_rank()).nonzero()[0].tolist()  # this rank's coordinates in the grid
    grid, groups = mesh.mesh, {}
    for j, name in enumerate(sizes):
        line = [slice(None) if i == j else c for i, c in enumerate(where)]
        groups[name] = grid[tuple(line)].tolist()
"""
COORDINATES_THEN_STRIDES = """    coords, stride, groups = dict(zip(sizes, mesh.get_coordinate())), 1, {}
    for name in reversed(list(sizes)):
        start = dist.get_rank() - coords[name] * stride
        groups[name] = list(range(start, start + sizes[name] * stride, stride))
        stride *= sizes[name]
"""

MISTAKES = {
    "mesh dimensions in the reverse order": (
        "mesh_groups", broken("mesh_groups", 'sizes = {"pp": pp, "dp": dp, "cp": cp, "tp": tp}',
                              'sizes = {"tp": tp, "cp": cp, "dp": dp, "pp": pp}'),
        ["world of 1", "the mesh's dimensions are ordered ('tp', 'cp', 'dp', 'pp')", "torchtitan's order"], 60),
    "groups computed with pp innermost": (
        "mesh_groups", broken("mesh_groups", "for name in reversed(list(sizes)):", "for name in sizes:"),
        ["world of 4", "dp=2 tp=2", "the group it would have with the dimensions reversed",
         "tp varies fastest"], 90),
    "dimensions of size 1 left out": (
        "mesh_groups", broken("mesh_groups", "return mesh, {name: groups[name] for name in sizes}",
                              "return mesh, {name: groups[name] for name in sizes if sizes[name] > 1}"),
        ["world of 1", "groups has no entry for pp, dp, cp, tp", "size 1 too"], 60),
    "the groups asked of the other ranks": (
        "mesh_groups", broken("mesh_groups", LOOP, ASK_THE_OTHERS),
        ["world of 1", "the mesh and the groups are right, but the solution called dist.all_gather_object",
         "no collective is needed"], 60),
    "the groups read from torch's process groups": (
        "mesh_groups", broken("mesh_groups", LOOP, ASK_TORCHS_GROUPS),
        ["world of 1", "the solution asked torch for them", "DeviceMesh.get_group",
         "dist.get_process_group_ranks", "mixed radix"], 60),
    "the groups read from the mesh's tensor of ranks": (
        "mesh_groups", broken("mesh_groups", LOOP, ASK_THE_MESH_TENSOR),
        ["world of 1", "the solution asked torch for them", "DeviceMesh.mesh", "mixed radix"], 60),
}

ALSO_RIGHT = {
    "the coordinates from the mesh, the groups by strides": (
        "mesh_groups", broken("mesh_groups", LOOP, COORDINATES_THEN_STRIDES), 60),
}
