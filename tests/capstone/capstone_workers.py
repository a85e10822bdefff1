"""Spawn targets for tests/capstone: several layouts per launch, to keep the tests short."""

from __future__ import annotations

import torch.distributed as dist

from ddp_tutorial.capstone.composed import composed_worker
from ddp_tutorial.capstone.layout import Layout, build_mesh


def mesh_facts(rank: int, world_size: int, layouts: list[dict]) -> list[dict]:
    """For each layout (of ``world_size`` ranks): what torch's ``DeviceMesh`` says of this rank, its
    coordinate and, per dimension, the ranks of its process group."""
    out = []
    for layout in layouts:
        mesh = build_mesh(Layout(**layout))
        out.append({"names": mesh.mesh_dim_names, "shape": tuple(mesh.shape),
                    "coordinate": dict(zip(mesh.mesh_dim_names, mesh.get_coordinate())),
                    "groups": {d: dist.get_process_group_ranks(mesh[d].get_group()) for d in mesh.mesh_dim_names}})
    return out


def composed_runs(rank: int, world_size: int, layouts: list[dict], steps: int) -> list[dict]:
    """``composed_worker`` for each layout in turn, on the same ranks."""
    return [composed_worker(rank, world_size, layout, steps) for layout in layouts]
