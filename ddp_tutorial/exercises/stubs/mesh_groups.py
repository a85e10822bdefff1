"""Exercise 22.1 (medium), lesson 22_capstone.ipynb: a layout's DeviceMesh, and which ranks share each group.

Write mesh_groups() below (its docstring is the contract: what must hold), then check it:
    check("mesh_groups")                                 in the notebook
    python -m ddp_tutorial.exercises check mesh_groups   from a shell
The checker's ranks read this file afresh each time: an edit counts at once.
A hint: python -m ddp_tutorial.exercises show mesh_groups
Start again from the stub: python -m ddp_tutorial.exercises reset mesh_groups
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
    # Your code here; the checker calls mesh_groups(dp, tp, pp, cp) on every rank.
    raise NotImplementedError(
        'exercise 22.1 (mesh_groups): not started yet, as expected for a fresh stub: '
        'my_exercises/mesh_groups.py still raises NotImplementedError. Next: write mesh_groups() '
        'there (its docstring is the contract, lesson 22_capstone.ipynb explains it, '
        "show('mesh_groups') gives hints), then check again")
