"""Exercise 15.2, reference solution: average the gradients over the mesh's ``dp`` dimension only.

On a ``dp x tp`` mesh the ranks of one ``tp`` group hold *different* pieces of each split
weight, and see the same data rows; the ranks of one ``dp`` group hold the *same* piece and
see different rows. Data parallelism averages copies of the same piece, so the gradient
all-reduce runs over the ``dp`` group, never the default (world) group and never ``tp``: a
sum over ``tp`` would add different shards together. The replicated ``net2.bias`` is no
exception: its gradient is computed whole, and identical, on every ``tp`` rank of a row (the
output gradient after ``g`` is whole on each), so it is averaged over ``dp`` like the shards.

``mesh.get_group("dp")`` (or ``mesh["dp"].get_group()``) is the process group of this rank's
``dp`` dimension, whatever order the dimensions were named in. SUM then divide by the group's
size, or ``ReduceOp.AVG`` in one call: the same mean.
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
    group = mesh.get_group("dp")  # this rank's dp group: the ranks that hold the same pieces
    size = dist.get_world_size(group)
    for grad in grads.values():
        dist.all_reduce(grad, group=group)  # SUM over the dp copies of this piece
        grad.div_(size)  # their mean: the whole global batch's gradient
