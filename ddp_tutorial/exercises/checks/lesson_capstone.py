"""Lesson 22's exercise: a layout's ``DeviceMesh`` and the ranks that share each of its groups.

The reference is computed twice, without the learner's code: by ``capstone.layout.group_ranks``
(mixed radix) and by torch (``dist.get_process_group_ranks`` of each dimension of the checker's
own reading of the learner's mesh). The checker records the collectives the solution calls,
and the places where the solution's own code reads the answer from torch (``torch_asked``:
``dist.get_process_group_ranks``, a mesh's ``get_group``/``get_all_groups``, its ``.mesh``
tensor): the groups follow from the rank and the sizes, so a solution that asks the other
ranks (``all_gather_object`` of coordinates) or torch (``(mesh.mesh == rank).nonzero()``) gets
the numbers right the wrong way and fails.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch.distributed as dist
from torch.distributed import distributed_c10d
from torch.distributed.device_mesh import DeviceMesh

from ddp_tutorial.capstone.layout import MESH_DIMS, Layout, group_ranks
from ddp_tutorial.env import rank_device
from ddp_tutorial.exercises.exercise import Exercise
from ddp_tutorial.exercises.harness import Case, Report, load_function, run_cases
from ddp_tutorial.exercises.recording import patched
from ddp_tutorial.exercises.tracing import COLLECTIVES, traced
from ddp_tutorial.exercises.watching import wrong_mesh_device

# The layouts checked on each world size, (dp, tp, pp, cp) as the function takes them.
LAYOUTS = {
    1: [(1, 1, 1, 1)],
    2: [(2, 1, 1, 1), (1, 2, 1, 1), (1, 1, 2, 1), (1, 1, 1, 2)],
    3: [(1, 3, 1, 1), (1, 1, 3, 1)],
    4: [(2, 2, 1, 1), (1, 2, 2, 1), (1, 1, 2, 2), (2, 1, 1, 2), (4, 1, 1, 1)],
    8: [(2, 2, 2, 1), (4, 2, 1, 1), (2, 1, 2, 2), (2, 2, 1, 2), (1, 2, 4, 1)],
}


def reversed_groups(rank: int, layout: Layout) -> dict[str, list[int]]:
    """The groups if the dimensions were laid out the other way round (``tp`` outermost, ``pp`` innermost)."""
    groups, stride = {}, 1
    for dim in MESH_DIMS:
        size = getattr(layout, dim)
        digit = rank // stride % size
        groups[dim] = [rank - digit * stride + i * stride for i in range(size)]
        stride *= size
    return groups


def wrong_mesh(mesh: object, layout: Layout) -> str | None:
    """What is wrong with the returned mesh (None: its names, order, shape and device type are right)."""
    if not isinstance(mesh, DeviceMesh):
        return f"the first item returned is {type(mesh).__name__}, not the DeviceMesh"
    names = mesh.mesh_dim_names
    if names is None:
        return f"the mesh's dimensions have no names: init_device_mesh(..., mesh_dim_names={MESH_DIMS})"
    if tuple(names) != MESH_DIMS:
        if sorted(names) == sorted(MESH_DIMS):
            return (f"the mesh's dimensions are ordered {tuple(names)}: torchtitan's order is {MESH_DIMS}, "
                    "outermost first (tp innermost: its ranks are neighbours, inside one node)")
        return f"the mesh's dimensions are named {tuple(names)}, expected {MESH_DIMS}"
    if tuple(mesh.shape) != layout.shape:
        return (f"the mesh's shape is {tuple(mesh.shape)}, expected {layout.shape}: the sizes of pp, dp, cp, tp "
                "in that order")
    return wrong_mesh_device(mesh, rank_device().type)  # "cpu" written in: right on a laptop, wrong on GPUs


def wrong_groups(groups: object, rank: int, layout: Layout, *, mesh: DeviceMesh) -> str | None:
    """What is wrong with the returned groups (None: each is this rank's group, as torch's mesh says)."""
    want = group_ranks(rank, layout)
    torch_says = {d: dist.get_process_group_ranks(mesh[d].get_group()) for d in MESH_DIMS}
    assert torch_says == want, (torch_says, want)  # the two references agree before the learner is judged
    if not isinstance(groups, dict):
        return f"the second item returned is {type(groups).__name__}, not a dict of dimension name -> ranks"
    missing = [d for d in MESH_DIMS if d not in groups]
    if missing:
        return (f"groups has no entry for {', '.join(missing)}: every dimension has a group, a dimension of "
                "size 1 too (the rank alone)")
    for dim in MESH_DIMS:
        got = groups[dim]
        got = list(got) if isinstance(got, (list, tuple)) else got
        if got == want[dim]:
            continue
        if got == reversed_groups(rank, layout)[dim]:
            return (f"rank {rank}'s {dim} group is {got}, the group it would have with the dimensions reversed; "
                    f"in the mesh tp varies fastest (stride 1) and pp slowest: {want[dim]}")
        if isinstance(got, list) and sorted(got) == want[dim]:
            return f"rank {rank}'s {dim} group holds the right ranks, {want[dim]}, but not in ascending order"
        return (f"rank {rank}'s {dim} group should be {want[dim]} (the ranks whose coordinates differ from "
                f"rank {rank}'s only in {dim}), got {got}")
    return None


# A mesh's attributes that hold the answer: its ranks laid out (``.mesh``) and its process groups.
ANSWER_ATTRIBUTES = ("mesh", "get_group", "get_all_groups")


@contextmanager
def torch_asked(source: str) -> Iterator[list[str]]:
    """While the block runs, list each way the code of file ``source`` itself reads the groups from
    torch (the library's own uses, inside ``init_device_mesh`` say, are not the learner's): an
    attribute of ``ANSWER_ATTRIBUTES`` looked up on a ``DeviceMesh``, or ``get_process_group_ranks``."""
    asked: list[str] = []
    lookup, ranks = DeviceMesh.__getattribute__, dist.get_process_group_ranks

    def learners(depth: int) -> bool:
        return sys._getframe(depth + 1).f_code.co_filename == source

    def getattribute(mesh: DeviceMesh, name: str) -> object:
        if name in ANSWER_ATTRIBUTES and learners(1):
            asked.append(f"DeviceMesh.{name}")
        return lookup(mesh, name)

    def get_process_group_ranks(group: dist.ProcessGroup) -> list[int]:
        if learners(1):
            asked.append("dist.get_process_group_ranks")
        return ranks(group)

    with patched([(DeviceMesh, "__getattribute__", getattribute), (dist, "get_process_group_ranks", get_process_group_ranks),
                  (distributed_c10d, "get_process_group_ranks", get_process_group_ranks)]):
        yield asked


def mesh_groups_worker(rank: int, world_size: int, source: str, function: str, trace_dir: str) -> Report:
    """Each layout of ``world_size`` ranks in ``LAYOUTS``: the mesh, the groups, no collective."""
    with traced(rank, trace_dir, record=COLLECTIVES) as trace:
        fn = load_function(source, function, refuse=("ddp_tutorial.capstone",))

        def case(dp: int, tp: int, pp: int, cp: int) -> str | None:
            layout = Layout(dp=dp, tp=tp, pp=pp, cp=cp)
            with torch_asked(str(Path(source))) as read:
                result = fn(dp, tp, pp, cp)
            if not (isinstance(result, tuple) and len(result) == 2):
                return f"returned {type(result).__name__}; return a pair: (mesh, groups)"
            mesh, groups = result
            problem = wrong_mesh(mesh, layout) or wrong_groups(groups, rank, layout, mesh=mesh)
            if problem:
                return problem
            asked = sorted({f"dist.{c.kind}" for c in trace.calls})
            if asked:
                return (f"the mesh and the groups are right, but the solution called {', '.join(asked)}: the "
                        "groups follow from the rank and the sizes alone, no collective is needed")
            if read:
                return (f"the mesh and the groups are right, but the solution asked torch for them "
                        f"({', '.join(sorted(set(read)))}): that is the answer the checker compares with; compute "
                        "each group from the rank and the sizes (mixed radix: a stride per dimension)")
            return None

        cases: list[Case] = [(f"dp={dp} tp={tp} pp={pp} cp={cp}", lambda a=a: case(*a))
                             for a in LAYOUTS[world_size] for dp, tp, pp, cp in [a]]
        return run_cases(trace, cases)


EXERCISES = [
    Exercise(
        name="mesh_groups", number="22.1", lesson=22, notebook="22_capstone.ipynb",
        title="a layout's DeviceMesh, and which ranks share each group", level="medium",
        task=("Given the sizes dp, tp, pp, cp of a layout, build its DeviceMesh over every rank with the "
              "dimensions pp, dp, cp, tp (outermost first), and return it with, for each dimension, the ranks "
              "of this rank's group along it, computed from the rank and the sizes."),
        hint=("Picture torch.arange(world).reshape(pp, dp, cp, tp): a rank's coordinates are its index in that "
              "array, tp the fastest. A group of dimension d is a line of the array along d. How far apart are "
              "two neighbours along tp? Along cp? Along pp?"),
        checks=("17 layouts in all, 5 of them on 8 ranks (dp2 x tp2 x pp2, dp4 x tp2, ...); the mesh's dimension "
                "names, their order and its shape; each rank's group of every dimension (size 1 too) against "
                "the mixed-radix computation and against torch's own process groups of the mesh; no collective "
                "called by the solution, and no group read from torch (the mesh's .mesh, get_group, "
                "get_process_group_ranks); ddp_tutorial.capstone is refused"),
        worker=mesh_groups_worker, world_sizes=(1, 2, 3, 4, 8)),
]
