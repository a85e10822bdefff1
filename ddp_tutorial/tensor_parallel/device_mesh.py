"""DeviceMesh, DTensor and ``parallelize_module``, then a 2-D mesh (``15_tensor_parallel``).

``tensor_parallel`` split ToyModel by hand. Here torch does the bookkeeping:

- a ``DeviceMesh`` names the ranks as an n-dimensional grid (``init_device_mesh``);
- a ``DTensor`` is one logical tensor stored across a mesh, with a *placement* per mesh
  dimension: ``Shard(d)`` (cut along tensor dim ``d``, as ``torch.chunk`` cuts) or
  ``Replicate()`` (a whole copy on every rank); ``to_local()`` is this rank's piece,
  ``full_tensor()`` gathers the whole;
- ``parallelize_module`` turns ``nn.Linear`` weights into DTensors: ``ColwiseParallel``
  shards the weight's rows (``Shard(0)``: output units), ``RowwiseParallel`` its columns
  (``Shard(1)``: input units), and inserts the same two all-reduces as the hand-made split;
- a 2-D mesh of ``dp x tp`` ranks: tensor parallel inside each row of the mesh, data
  parallel (a gradient all-reduce) down its columns.

    torchrun --nproc-per-node=4 -m ddp_tutorial.tensor_parallel.device_mesh   # DTensor, parallelize_module, a 2 x 2 mesh
    torchrun --nproc-per-node=2 -m ddp_tutorial.tensor_parallel.device_mesh   # the same with a 1 x 2 mesh
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch import nn

from ddp_tutorial.env import distributed, rank_device
from ddp_tutorial.launch.errors import UsageParser, check_world_size, exit_on_interrupt
from ddp_tutorial.launch.verdict import verdict
from ddp_tutorial.pipeline_parallel.model_parallel import toy_batch
from ddp_tutorial.tensor_parallel.split_mlp import TOLERANCE, compare, make_mlp, one_process, shard_range

if TYPE_CHECKING:  # torch.distributed.tensor is imported by the workers that use it
    from torch.distributed.tensor import DTensor

__all__ = ["mesh_device_type", "chunk_block", "local_block", "block_of", "dtensor_worker", "tp_plan",
           "parallelize_worker", "mesh_2d_worker", "train_one_process", "main"]

PROG = "python -m ddp_tutorial.tensor_parallel.device_mesh"
HIDDEN = 8  # ToyModel's hidden units in main: parallelize_worker splits them over every rank


def mesh_device_type() -> str:
    """The mesh's device type: ``"cuda"`` where the group serves this rank's GPU, else ``"cpu"``."""
    return rank_device().type


def chunk_block(size: int, index: int, parts: int) -> tuple[int, int]:
    """Length and offset of piece ``index`` when ``size`` is cut into ``parts`` as ``torch.chunk`` cuts:
    pieces of ``ceil(size / parts)``, the last ones shorter or empty."""
    step = -(-size // parts)
    start = min(size, step * index)
    return min(size, start + step) - start, start


def local_block(global_shape: Sequence[int], placements: Sequence[str], coordinate: Sequence[int],
                mesh_shape: Sequence[int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The local shape and global offset of the rank at ``coordinate`` on the mesh, computed by hand.

    ``placements`` has one entry per mesh dimension: ``"S(d)"`` (``Shard(d)``) or ``"R"``
    (``Replicate()``), as ``str()`` of torch's placements reads. Mesh dimensions apply in
    order, so two that shard one tensor dimension cut the first one's piece again.
    """
    shape, offset = list(global_shape), [0] * len(global_shape)
    for placement, index, parts in zip(placements, coordinate, mesh_shape):
        if placement.startswith("S("):
            dim = int(placement[2:-1])
            length, start = chunk_block(shape[dim], index, parts)
            shape[dim], offset[dim] = length, offset[dim] + start
        elif placement != "R":
            raise ValueError(f"placement {placement!r}: only Shard and Replicate are drawn here")
    return tuple(shape), tuple(offset)


def block_of(tensor: DTensor, full: torch.Tensor) -> dict:
    """``tensor``'s piece on this rank: placements, local shape and offset (from ``local_block``),
    checked against the data: the piece must equal that block of ``full``, the whole tensor."""
    mesh = tensor.device_mesh
    placements = [str(p) for p in tensor.placements]
    local = tensor.to_local()
    shape, offset = local_block(tensor.shape, placements, mesh.get_coordinate(), mesh.shape)
    assert tuple(local.shape) == shape, (tuple(local.shape), shape)
    where = tuple(slice(o, o + n) for o, n in zip(offset, shape))
    assert torch.equal(local.detach().cpu(), full.detach().cpu()[where]), "the piece is not where it was computed"
    return {"placements": placements, "shape": shape, "offset": offset, "global_shape": tuple(tensor.shape)}


def dtensor_worker(rank: int, world_size: int, shape: tuple[int, int] = (4, 6)) -> dict:
    """One ``shape`` tensor of 0, 1, 2, ... distributed three ways over a 1-D mesh of all ranks.

    For each of ``Shard(0)``, ``Shard(1)``, ``Replicate()``: the local piece's values, and its
    shape and offset from ``block_of`` (which checks them against the values); and that
    ``full_tensor()`` gives the whole back.
    """
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor, init_device_mesh

    mesh = init_device_mesh(mesh_device_type(), (world_size,))  # all ranks in a row: the default group
    full = torch.arange(shape[0] * shape[1], dtype=torch.float32, device=mesh.device_type).reshape(shape)
    pieces = {}
    for placement in (Shard(0), Shard(1), Replicate()):
        dt = distribute_tensor(full, mesh, [placement])  # rank 0's tensor is the source, sent in pieces
        pieces[str(placement)] = {**block_of(dt, full), "local": dt.to_local().cpu().tolist(),
                                  "round_trip": torch.equal(dt.full_tensor(), full)}
    # DTensor's collectives are functional collectives: started at once, waited for when their
    # result is first used. Every rank finishes its last one before any rank returns and the
    # launcher destroys the group: a rank closing its gloo connections under a peer's collective
    # can make that peer fail or abort at exit.
    dist.barrier()
    return {"rank": rank, "device_type": mesh.device_type, "mesh": mesh.mesh.tolist(),
            "coordinate": mesh.get_coordinate(), "pieces": pieces}


def tp_plan() -> dict:
    """ToyModel's tensor-parallel plan: the hand-made split, in ``parallelize_module``'s words."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    return {"net1": ColwiseParallel(), "net2": RowwiseParallel()}


def parallelize_worker(rank: int, world_size: int, hidden: int = 8, batch_size: int = 4, seed: int = 0) -> dict:
    """``hand_tp_worker``'s forward and backward, with the split done by ``parallelize_module``.

    Returns the same fields (output, input gradient, this rank's gradient shards, collectives
    counted) and where each weight's piece lies (``blocks``).
    """
    from torch.distributed.tensor import init_device_mesh
    from torch.distributed.tensor.debug import CommDebugMode
    from torch.distributed.tensor.parallel import parallelize_module

    mesh = init_device_mesh(mesh_device_type(), (world_size,))
    full = make_mlp(hidden=hidden, seed=seed).to(mesh.device_type)
    model = parallelize_module(make_mlp(hidden=hidden, seed=seed).to(mesh.device_type), mesh, tp_plan())
    x, y = toy_batch(0, batch_size, seed, dtype=torch.float32)
    x, y = x.to(mesh.device_type).requires_grad_(), y.to(mesh.device_type)
    with CommDebugMode() as forward_comms:
        out = model(x)  # RowwiseParallel hands back a plain, replicated tensor
        loss = nn.functional.mse_loss(out, y)
    with CommDebugMode() as backward_comms:
        loss.backward()
    whole = dict(full.named_parameters())
    blocks = {n: block_of(p, whole[n]) for n, p in model.named_parameters()}
    dist.barrier()  # as in dtensor_worker: no rank leaves while a peer's collective may still run
    return {"rank": rank, "output": out.detach().cpu(), "input_grad": x.grad.cpu(),
            "grads": {n: p.grad.to_local().cpu() for n, p in model.named_parameters()},
            "blocks": blocks,
            "collectives": {"forward": forward_comms.get_total_counts(),
                            "backward": backward_comms.get_total_counts()}}


def mesh_2d_worker(rank: int, world_size: int, num_steps: int = 3, lr: float = 0.1, hidden: int = 8,
                   global_batch: int = 8, tp_size: int = 2, seed: int = 0) -> dict:
    """Train ToyModel on a ``dp x tp`` mesh: tensor parallel inside each row, data parallel down the columns.

    ``init_device_mesh(..., (dp, tp))`` puts ranks ``[[0, 1], [2, 3]]`` on a 2 x 2 mesh: ranks 0, 1
    split the model (``mesh["tp"]``) and so do 2, 3; ranks 0, 2 are replicas of the same pieces
    (``mesh["dp"]``) and so are 1, 3. Each ``dp`` row of the mesh trains on its rows of the
    global batch; the pieces' gradients are averaged over ``mesh["dp"]`` by hand, as DDP would.
    Returns the global loss per step, the final whole weights and each weight's ``blocks``.
    """
    from torch.distributed.tensor import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module

    if world_size % tp_size:
        raise ValueError(f"a tensor-parallel size of {tp_size} does not divide world_size={world_size}")
    dp_size = world_size // tp_size
    if global_batch % dp_size:
        raise ValueError(f"global_batch={global_batch} does not split evenly over {dp_size} data-parallel rows")
    mesh = init_device_mesh(mesh_device_type(), (dp_size, tp_size), mesh_dim_names=("dp", "tp"))
    dp_group, dp_rank = mesh["dp"].get_group(), mesh["dp"].get_local_rank()
    model = parallelize_module(make_mlp(hidden=hidden, seed=seed).to(mesh.device_type), mesh["tp"], tp_plan())
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    rows, losses = global_batch // dp_size, []
    for step in range(num_steps):
        x, y = toy_batch(step, global_batch, seed, dtype=torch.float32)
        mine = slice(dp_rank * rows, (dp_rank + 1) * rows)  # the tp ranks of a row share its rows
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x[mine].to(mesh.device_type)), y[mine].to(mesh.device_type))
        loss.backward()
        for p in model.parameters():  # data parallel: average each local piece over mesh["dp"]
            piece = p.grad.to_local()  # the very tensor the DTensor gradient holds
            dist.all_reduce(piece, group=dp_group)
            piece.div_(dp_size)
        optimizer.step()  # SGD on DTensors: each rank updates its own pieces
        total = loss.detach().clone()
        dist.all_reduce(total, group=dp_group)
        losses.append(total.item() / dp_size)
    whole = {n: p.full_tensor() for n, p in model.named_parameters()}  # all-gathers over mesh["tp"]
    blocks = {n: block_of(p, whole[n]) for n, p in model.named_parameters()}
    dist.barrier()  # as in dtensor_worker: no rank leaves while a peer's collective may still run
    return {"rank": rank, "coordinate": dict(zip(("dp", "tp"), mesh.get_coordinate())),
            "tp_ranks": mesh["tp"].mesh.tolist(), "dp_ranks": mesh["dp"].mesh.tolist(), "losses": losses,
            "state": {n: w.detach().cpu() for n, w in whole.items()}, "blocks": blocks}


def train_one_process(num_steps: int = 3, lr: float = 0.1, hidden: int = 8, global_batch: int = 8,
                      seed: int = 0) -> dict:
    """ToyModel trained by one process on the whole global batch: what the 2-D mesh must match."""
    model = make_mlp(hidden=hidden, seed=seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for step in range(num_steps):
        x, y = toy_batch(step, global_batch, seed, dtype=torch.float32)
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return {"losses": losses, "state": {n: p.detach().clone() for n, p in model.named_parameters()}}


def main(argv: list[str] | None = None) -> None:
    parser = UsageParser(prog=PROG, description=__doc__.splitlines()[0])
    parser.add_argument("--num-steps", type=int, default=3)
    parser.add_argument("--tp-size", type=int, default=None,
                        help="ranks per tensor-parallel group (default: 2 for an even world size, else 1)")
    args = parser.parse_args(argv)
    for option, value in (("--num-steps", args.num_steps), ("--tp-size", args.tp_size)):
        if value is not None and value < 1:
            parser.error(f"{option} must be at least 1, got {value}")

    def fits(world_size: int) -> int:  # the workers' own checks, from torchrun's WORLD_SIZE
        tp_size = args.tp_size or (2 if world_size % 2 == 0 else 1)
        try:
            shard_range(HIDDEN, 0, world_size)
        except ValueError as err:
            raise ValueError(f"{err}; start it with torchrun --nproc-per-node a divisor of {HIDDEN}, e.g. 2 or 4") from None
        if world_size % tp_size:
            raise ValueError(f"a tensor-parallel size of {tp_size} does not divide world_size={world_size}; "
                             "choose --tp-size a divisor of torchrun's --nproc-per-node")
        return tp_size

    # Every rank would refuse the same mesh alike: said once, before any group.
    tp_size = check_world_size(PROG, fits)
    with exit_on_interrupt(PROG, "nothing was saved; run it again"), distributed() as (info, _):
        global_batch = 4 * (info.world_size // tp_size)
        pieces = dtensor_worker(info.rank, info.world_size)["pieces"]
        split = parallelize_worker(info.rank, info.world_size)
        splits = [None] * info.world_size
        dist.all_gather_object(splits, split)
        trained = mesh_2d_worker(info.rank, info.world_size, args.num_steps, hidden=HIDDEN,
                                 global_batch=global_batch, tp_size=tp_size)
    if info.is_main:
        round_trips = all(p["round_trip"] for p in pieces.values())
        split_diff = max(compare(splits, one_process()).values())
        ref = train_one_process(args.num_steps, global_batch=global_batch)
        mesh_diff = max((trained["state"][n] - w).abs().max().item() for n, w in ref["state"].items())
        shapes = ", ".join(f"{k} {p['shape']}" for k, p in pieces.items())
        print(f"a (4, 6) tensor on {info.world_size} rank(s), rank 0's pieces: {shapes}; full_tensor() "
              f"gives it back: {round_trips}")
        print(f"parallelize_module: all-reduces forward {split['collectives']['forward']}, backward "
              f"{split['collectives']['backward']}; equals one process: {split_diff < TOLERANCE}")
        ok = round_trips and split_diff < TOLERANCE and mesh_diff < TOLERANCE
        verdict(ok, f"a {info.world_size // tp_size} x {tp_size} (dp x tp) mesh trains "
                    f"ToyModel as one process does on the global batch of {global_batch}, to {TOLERANCE:g}")


if __name__ == "__main__":
    main()
