"""Pipeline stages across processes times data-parallel replicas: a 2-D grid (``10_model_parallel_ddp``).

With ``world_size = num_stages x num_replicas`` ranks, rank ``r`` holds stage
``r % num_stages`` of replica ``r // num_stages``. Inside a replica, activations
go forward and their gradients come back with point-to-point ops (``isend`` /
``recv``). Across replicas, the ranks holding the same stage average their
gradients with an all-reduce inside their own ``new_group``: DDP, per stage.

    torchrun --nproc-per-node=4 -m ddp_tutorial.pipeline_parallel.pipeline_grid              # 2 stages x 2 replicas
    torchrun --nproc-per-node=6 -m ddp_tutorial.pipeline_parallel.pipeline_grid --widths 10 10 10 5   # 3 x 2
    python -m ddp_tutorial.pipeline_parallel.pipeline_grid       # one process: fails with a one-line message
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from ddp_tutorial.env import distributed, rank_device, rank_info
from ddp_tutorial.launch.errors import UsageParser, check_world_size, exit_on_interrupt
from ddp_tutorial.pipeline_parallel.model_parallel import toy_batch

__all__ = ["Grid", "mlp_stages", "grid_worker", "pipeline_step", "average_gradients", "sgd_step", "train_whole_model",
           "main"]

PROG = "python -m ddp_tutorial.pipeline_parallel.pipeline_grid"


@dataclass(frozen=True)
class Grid:
    """Which rank holds which stage of which replica: ``rank = replica * num_stages + stage``.

    Adjacent ranks form one pipeline and the replicas are the outermost axis: picotron's
    order (``[dp, pp, cp, tp]``). Megatron-LM (``tp-cp-ep-dp-pp``, innermost first) and
    torchtitan (mesh ``[pp, dp_replicate, dp_shard, cp, tp]``) put the pipeline outermost
    instead, since its point-to-point activations are the lightest traffic and can take the
    farthest links. All of them keep tensor parallel innermost, inside a node. Here a stage
    is one device; in large runs a stage is a node's tensor-parallel GPUs."""

    world_size: int
    num_stages: int

    def __post_init__(self) -> None:
        if self.num_stages < 1 or self.world_size < 1:
            raise ValueError(f"need world_size >= 1 and num_stages >= 1, got {self.world_size} and {self.num_stages}")
        if self.world_size % self.num_stages:
            raise ValueError(
                f"a grid of {self.num_stages} pipeline stages cannot cover world_size={self.world_size}: "
                f"the world size must be a multiple of {self.num_stages} (stages x replicas)")

    @property
    def num_replicas(self) -> int:
        return self.world_size // self.num_stages

    def stage_of(self, rank: int) -> int:
        return rank % self.num_stages

    def replica_of(self, rank: int) -> int:
        return rank // self.num_stages

    def pipeline_ranks(self, replica: int) -> list[int]:
        """The ranks that pass activations to each other, stage 0 first."""
        return [replica * self.num_stages + s for s in range(self.num_stages)]

    def data_parallel_ranks(self, stage: int) -> list[int]:
        """The ranks holding the same stage: they all-reduce gradients together."""
        return [r * self.num_stages + stage for r in range(self.num_replicas)]


def mlp_stages(widths: tuple[int, ...] = (10, 10, 5), seed: int = 0) -> list[nn.Sequential]:
    """An MLP cut after each hidden ReLU: stage ``s`` is ``Linear(w[s], w[s+1])`` (+ ReLU but the last).

    With the default widths this is ToyModel in two stages. Same seed, same weights on every rank.
    """
    torch.manual_seed(seed)
    stages = []
    for s in range(len(widths) - 1):
        layers: list[nn.Module] = [nn.Linear(widths[s], widths[s + 1])]
        if s < len(widths) - 2:
            layers.append(nn.ReLU())
        stages.append(nn.Sequential(*layers).double())
    return stages


def _split(n: int, parts: int, what: str) -> int:
    if n % parts:
        raise ValueError(f"{what}={n} does not split evenly into {parts}")
    return n // parts


def grid_worker(rank: int, world_size: int, num_steps: int = 3, lr: float = 0.1, global_batch: int = 8,
                num_micro: int = 2, widths: tuple[int, ...] = (10, 10, 5), seed: int = 0) -> dict:
    """Train one stage of one replica: per step, a pipeline flush, then data parallelism per stage.

    Returns the rank's place in the grid, its groups, the order it ran the micro-batches in
    (``schedule``, the same every step), the global loss per step (last stage only) and
    its stage's final weights.
    """
    grid = Grid(world_size, len(widths) - 1)
    stage, replica = grid.stage_of(rank), grid.replica_of(rank)
    rows = _split(global_batch, grid.num_replicas, "global_batch")
    micro = _split(rows, num_micro, f"rows per replica ({rows}); num_micro")
    last = stage == grid.num_stages - 1
    # Every rank must call new_group for every group, in the same order, even groups it is not in.
    dp_groups = [dist.new_group(grid.data_parallel_ranks(s)) for s in range(grid.num_stages)]
    device = rank_device()  # one stage per rank: cuda:LOCAL_RANK with NCCL, else the CPU
    module = mlp_stages(widths, seed)[stage].to(device)
    losses = []
    for step in range(num_steps):
        x, y = toy_batch(step, global_batch, seed, widths[0], widths[-1])
        mine = slice(replica * rows, (replica + 1) * rows)
        module.zero_grad()
        order, loss_sum = pipeline_step(module, x[mine].to(device).split(micro), y[mine].to(device).split(micro),
                                        rank=rank, stage=stage, num_stages=grid.num_stages, widths=widths)
        average_gradients(module, dp_groups[stage], grid.num_replicas)
        sgd_step(module, lr)
        if last:
            dist.all_reduce(loss_sum, group=dp_groups[stage])
            losses.append(loss_sum.item() / grid.num_replicas)
    return {"rank": rank, "stage": stage, "replica": replica,
            "pipeline": grid.pipeline_ranks(replica), "data_parallel": grid.data_parallel_ranks(stage),
            "schedule": order, "losses": losses if last else None,
            "state": {k: v.detach().cpu() for k, v in module.state_dict().items()}}


def pipeline_step(module: nn.Module, xs: Sequence[torch.Tensor], ys: Sequence[torch.Tensor], *, rank: int,
                  stage: int, num_stages: int, widths: tuple[int, ...]) -> tuple[list[str], torch.Tensor]:
    """One GPipe-style flush of this stage over the micro-batches ``xs`` (targets ``ys``).

    Every stage but the last runs all its forwards, then all its backwards. The last stage
    has the loss, so it runs each micro-batch's backward right after its forward (F0 B0 F1
    B1 ...) and sends the input gradients back once its forwards are done; the backward wave
    reaches the earlier stages only after their forward phase, as in GPipe. Returns the
    order it ran ("F0" = forward of micro-batch 0, "B0" its backward) and the summed loss.
    """
    first, last, num_micro = stage == 0, stage == num_stages - 1, len(xs)
    prev_rank, next_rank = rank - 1, rank + 1  # neighbours in this replica's pipeline
    device, micro = xs[0].device, len(xs[0])
    inputs, outputs, sends, order = [], [], [], []
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    for m in range(num_micro):  # forward phase (and, on the last stage, each backward at once)
        if first:
            h = xs[m]
        else:
            h = torch.empty(micro, widths[stage], dtype=torch.float64, device=device)
            dist.recv(h, src=prev_rank)
            h.requires_grad_()
        out = module(h)
        inputs.append(h)
        order.append(f"F{m}")
        if last:
            # 1/num_micro: the micro-batch gradients add up to the replica's mean gradient
            loss = nn.functional.mse_loss(out, ys[m]) / num_micro
            loss.backward()
            order.append(f"B{m}")
            loss_sum += loss.detach()
        else:
            outputs.append(out)
            sends.append(dist.isend(out.detach(), dst=next_rank))
    for m in range(num_micro):  # backward phase (the last stage only sends its input gradients)
        if not last:
            grad = torch.empty(micro, widths[stage + 1], dtype=torch.float64, device=device)
            dist.recv(grad, src=next_rank)
            outputs[m].backward(grad)
            order.append(f"B{m}")
        if not first:
            sends.append(dist.isend(inputs[m].grad, dst=prev_rank))
    for work in sends:
        work.wait()
    return order, loss_sum


def average_gradients(module: nn.Module, group: dist.ProcessGroup, num_replicas: int) -> None:
    """Data parallelism, per stage: average each gradient over the replicas of this stage."""
    for p in module.parameters():
        dist.all_reduce(p.grad, group=group)
        p.grad /= num_replicas


def sgd_step(module: nn.Module, lr: float) -> None:
    """Plain SGD by hand: torch.optim's first use imports seconds of torch._dynamo."""
    with torch.no_grad():
        for p in module.parameters():
            p -= lr * p.grad


def train_whole_model(num_steps: int = 3, lr: float = 0.1, global_batch: int = 8,
                      widths: tuple[int, ...] = (10, 10, 5), seed: int = 0) -> dict:
    """The reference: one process trains all stages in sequence on the whole global batch."""
    stages = mlp_stages(widths, seed)
    model = nn.Sequential(*stages)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for step in range(num_steps):
        x, y = toy_batch(step, global_batch, seed, widths[0], widths[-1])
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return {"losses": losses, "states": [{k: v.detach().clone() for k, v in s.state_dict().items()}
                                         for s in stages]}


def main(argv: list[str] | None = None) -> None:
    parser = UsageParser(prog=PROG, description=__doc__.splitlines()[0])
    parser.add_argument("--widths", type=int, nargs="+", default=[10, 10, 5],
                        help="layer widths; len(widths) - 1 pipeline stages")
    parser.add_argument("--num-steps", type=int, default=3)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--global-batch", type=int, default=8)
    parser.add_argument("--num-micro", type=int, default=2)
    args = parser.parse_args(argv)
    if len(args.widths) < 2:
        parser.error(f"--widths needs at least 2 widths (an input and an output), got {len(args.widths)}")
    for option, value in (("--widths", min(args.widths)), ("--num-steps", args.num_steps),
                          ("--global-batch", args.global_batch), ("--num-micro", args.num_micro)):
        if value < 1:
            parser.error(f"{option} must be at least 1, got {value}")
    if not (math.isfinite(args.lr) and args.lr >= 0):
        parser.error(f"--lr must be a finite number of at least 0, got {args.lr}")
    stages = len(args.widths) - 1

    def fits(world_size: int) -> None:  # grid_worker's own checks, from torchrun's WORLD_SIZE
        try:
            grid = Grid(world_size, stages)
        except ValueError as err:
            raise ValueError(f"{err}; start it with torchrun --nproc-per-node={2 * stages} -m "
                             "ddp_tutorial.pipeline_parallel.pipeline_grid") from None
        try:
            rows = _split(args.global_batch, grid.num_replicas, "global_batch")
            _split(rows, args.num_micro, f"rows per replica ({rows}); num_micro")
        except ValueError as err:
            raise ValueError(f"{err}; choose --global-batch a multiple of {grid.num_replicas} replica(s) "
                             "x --num-micro") from None

    # Every rank would refuse the same grid alike: said once, before any group.
    check_world_size(PROG, fits)
    info = rank_info()
    with exit_on_interrupt(PROG, "nothing was saved; run it again"), distributed():
        result = grid_worker(info.rank, info.world_size, args.num_steps, args.lr, args.global_batch,
                             args.num_micro, tuple(args.widths))
        gathered = [None] * info.world_size
        dist.all_gather_object(gathered, result)
    if info.is_main:
        ref = train_whole_model(args.num_steps, args.lr, args.global_batch, tuple(args.widths))
        same = all(torch.allclose(r["state"][k], ref["states"][r["stage"]][k], atol=1e-6)
                   for r in gathered for k in r["state"])
        for r in gathered:
            print(f"rank {r['rank']}: stage {r['stage']} of replica {r['replica']}, "
                  f"pipeline {r['pipeline']}, data-parallel group {r['data_parallel']}")
        print(f"grid training equals one process training the whole model: {same}")


if __name__ == "__main__":
    main()
