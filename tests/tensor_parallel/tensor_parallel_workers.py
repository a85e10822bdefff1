"""Spawn targets for tests/tensor_parallel/test_split_mlp.py that only a test needs."""

from __future__ import annotations

import torch
import torch.distributed as dist

# (mesh shape, placements per mesh dimension) for a (5, 7) tensor: even, uneven, empty pieces,
# and two mesh dimensions cutting the same tensor dimension
LAYOUTS = [((4,), ("S(0)",)), ((4,), ("S(1)",)), ((2, 2), ("S(0)", "S(1)")), ((2, 2), ("S(1)", "S(1)")),
           ((2, 2), ("R", "S(0)")), ((2, 2), ("S(0)", "S(0)")), ((2, 2), ("R", "R"))]


def placed_pieces(rank: int, world_size: int, shape: tuple[int, int] = (5, 7)) -> list[dict]:
    """A tensor of 0, 1, 2, ... distributed by every layout of ``LAYOUTS``: this rank's piece of each."""
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor, init_device_mesh

    from ddp_tutorial.tensor_parallel.device_mesh import mesh_device_type

    full = torch.arange(shape[0] * shape[1], dtype=torch.float32, device=mesh_device_type()).reshape(shape)
    meshes = {mesh_shape: init_device_mesh(mesh_device_type(), mesh_shape) for mesh_shape, _ in LAYOUTS}
    pieces = []
    for mesh_shape, names in LAYOUTS:
        placements = [Replicate() if n == "R" else Shard(int(n[2:-1])) for n in names]
        local = distribute_tensor(full, meshes[mesh_shape], placements).to_local()
        pieces.append({"coordinate": meshes[mesh_shape].get_coordinate(), "local": local.cpu()})
    dist.barrier()  # DTensor's collectives may still be finishing on a peer: leave together
    return pieces
