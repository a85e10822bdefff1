"""Exercise 22.1, reference solution: a layout's DeviceMesh, and which ranks share each of its groups.

The mesh's dimensions are torchtitan's, outermost first: ``pp, dp, cp, tp``. Rank ``r`` sits at
the coordinates that write ``r`` in mixed radix with those sizes as digits, ``tp`` the last
(fastest) digit, exactly as ``torch.arange(world).reshape(pp, dp, cp, tp)`` places the ranks.
Moving one step along dimension ``d`` adds its *stride*, the product of the sizes after it
(``tp``: 1, ``cp``: tp, ``dp``: cp * tp, ``pp``: dp * cp * tp). Rank ``r``'s group of ``d``
is the ranks that differ from it only in ``d``'s digit: start from ``r`` with that digit set to
0, then take ``size(d)`` steps of ``stride(d)``. A dimension of size 1 still has a group: the
rank alone. No communication is needed: the rank and the sizes say it all.
"""

from __future__ import annotations

import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from ddp_tutorial.env import rank_device


def mesh_groups(dp: int, tp: int, pp: int, cp: int) -> tuple[DeviceMesh, dict[str, list[int]]]:
    """Build the layout's ``DeviceMesh`` over every rank, and say which ranks share this rank's groups.

    ``dp * tp * pp * cp`` is the world size. The mesh has the dimensions named
    ``("pp", "dp", "cp", "tp")`` in that order (outermost first, ``tp`` innermost: neighbouring
    ranks share a ``tp`` group) with those sizes, on the device type the group's backend serves
    (``ddp_tutorial.env.rank_device()``). Return ``(mesh, groups)``: ``groups`` maps each of the
    four names to the ranks of this rank's group along that dimension, ascending, this rank
    included (``[rank]`` for a size of 1). Compute the groups from the rank and the sizes; no
    collective is needed.
    """
    sizes = {"pp": pp, "dp": dp, "cp": cp, "tp": tp}  # outermost first
    mesh = init_device_mesh(rank_device().type, tuple(sizes.values()), mesh_dim_names=tuple(sizes))
    rank, stride, groups = dist.get_rank(), 1, {}
    for name in reversed(list(sizes)):  # tp first: the fastest digit, stride 1
        digit = rank // stride % sizes[name]
        start = rank - digit * stride  # this rank with its digit of `name` set to 0
        groups[name] = [start + i * stride for i in range(sizes[name])]
        stride *= sizes[name]
    return mesh, {name: groups[name] for name in sizes}
