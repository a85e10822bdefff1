"""Exercise 15.2 (medium), lesson 15_tensor_parallel.ipynb: the gradient all-reduce of a dp x tp mesh, over dp only.

Write dp_grad_average() below (its docstring is the contract: what must hold), then check it:
    check("dp_grad_average")                                 in the notebook
    python -m ddp_tutorial.exercises check dp_grad_average   from a shell
The checker's ranks read this file afresh each time: an edit counts at once.
Hints, one at a time: python -m ddp_tutorial.exercises show dp_grad_average [--hint 2 .. 3]
Start again from the stub: python -m ddp_tutorial.exercises reset dp_grad_average
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh


def dp_grad_average(mesh: DeviceMesh, grads: dict[str, torch.Tensor]) -> None:
    """Average this rank's gradients over the data-parallel dimension of ``mesh``, in place.

    ``mesh`` is a 2-D ``DeviceMesh`` over every rank with dimensions named ``"dp"`` and
    ``"tp"`` (in either order). ``grads`` holds this rank's local gradients of the lesson's
    ToyModel split over ``tp`` as in section 6: ``net1.weight`` and ``net1.bias`` are this
    rank's rows (``Shard(0)``), ``net2.weight`` its columns (``Shard(1)``), ``net2.bias`` is
    replicated (the whole bias gradient, the same on every ``tp`` rank of a row). Each was
    computed from the mean loss over this rank's ``dp`` share of the global batch (every share
    has as many rows). When the call returns, each tensor of ``grads`` (the same tensor object,
    written in place) holds the gradient of the mean loss over the whole global batch, cut the
    same way: this rank's shard stays this rank's shard. Communicate with ``torch.distributed``
    collectives, only among the ranks that hold the same pieces, each gradient's values once;
    return None.
    """
    # Your code here; the checker calls dp_grad_average(mesh, grads) on every rank.
    raise NotImplementedError(
        'exercise 15.2 (dp_grad_average): not started yet, as expected for a fresh stub: '
        'my_exercises/dp_grad_average.py still raises NotImplementedError. Next: write '
        'dp_grad_average() there (its docstring is the contract, lesson 15_tensor_parallel.ipynb '
        "explains it, show('dp_grad_average') gives hints), then check again")
