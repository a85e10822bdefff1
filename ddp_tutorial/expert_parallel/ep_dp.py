"""Expert parallelism with data parallelism: experts split, every other layer replicated (``21_expert_parallel``).

``TinyMoENet`` is a linear, a residual mixture of experts, and a linear. On ``n`` ranks each
rank trains on its own tokens (data parallelism, as in lesson 07); the experts are split over
groups of ``ep`` ranks (``n/ep`` copies of each, one per group), the dense layers and the
router are copied on every rank. After backward:

- dense layers and router: all-reduce over all ``n`` ranks, divided by ``n`` (DDP's mean);
- experts: each already sums, through the all-to-all, the gradients of the ``ep`` ranks of its
  group; an all-reduce over the ``n/ep`` ranks holding the same experts adds the other groups'
  (the same all-reduce DDP does, on a smaller group), and the division by ``n`` makes the mean.

Then each step equals one process training on the global batch (``train_one_process``).
The ranks ``r`` with the same ``r // ep`` form an expert-parallel group; the ranks with the
same ``r % ep`` hold the same experts: a 2-D ``DeviceMesh`` ``("dp", "ep")`` of shape
``(n/ep, ep)`` (lessons 15 and 22), whose ``"ep"`` group exchanges tokens and whose ``"dp"``
group all-reduces the experts' gradients.

    torchrun --nproc-per-node=4 -m ddp_tutorial.expert_parallel.ep_dp             # 2 x 2: ep 2, 2 copies
    torchrun --nproc-per-node=4 -m ddp_tutorial.expert_parallel.ep_dp --ep 4      # every expert once
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
from torch import nn

from ddp_tutorial.env import distributed, rank_device
from ddp_tutorial.expert_parallel.dispatch import ExpertParallelMoE
from ddp_tutorial.expert_parallel.routing import DIM
from ddp_tutorial.launch.errors import UsageParser, check_world_size, exit_on_interrupt
from ddp_tutorial.launch.verdict import verdict
from ddp_tutorial.models import TinyMoENet

__all__ = ["TOLERANCE", "LR", "make_net", "net_batch", "groups_of", "ep_dp_worker", "train_one_process", "main"]

PROG = "python -m ddp_tutorial.expert_parallel.ep_dp"

TOLERANCE = 1e-6  # float32 sums in another order, a few steps of SGD: as dispatch.TOLERANCE
LR = 0.1


def make_net(seed: int = 0) -> TinyMoENet:
    """The lesson's network (4 experts, top-2, capacity factor 1.5); same seed, same weights."""
    torch.manual_seed(seed)
    return TinyMoENet(DIM, 16, num_experts=4, top_k=2, capacity_factor=1.5)


def net_batch(step: int, world_size: int, tokens_per_rank: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """Step ``step``'s global batch ``(x, target)``: rank r trains on rows r*t .. (r+1)*t."""
    gen = torch.Generator().manual_seed(100 + step)
    x = torch.randn(world_size * tokens_per_rank, DIM, generator=gen)
    return x, x.flip(-1).tanh()  # something to learn: reverse the features, squash them


def groups_of(rank: int, world_size: int, ep: int) -> tuple[list[int], list[int]]:
    """``(expert-parallel group, expert-replica group)`` of ``rank``: the ranks it exchanges tokens
    with, and the ranks that hold the same experts."""
    if ep < 1 or world_size % ep:
        raise ValueError(f"an expert-parallel size of {ep} does not divide world_size={world_size}")
    first = rank - rank % ep
    return list(range(first, first + ep)), list(range(rank % ep, world_size, ep))


def ep_dp_worker(rank: int, world_size: int, ep: int = 2, steps: int = 3) -> dict:
    """Train ``TinyMoENet`` for ``steps`` SGD steps: experts over ``ep`` ranks, the rest data-parallel.

    Returns the losses (mean over the global batch), the final weights by name, experts by
    global index, and this rank's groups.
    """
    from torch.distributed.device_mesh import init_device_mesh

    groups_of(rank, world_size, ep)  # refuses a layout that does not fit, before any collective
    device = rank_device()
    mesh = init_device_mesh(device.type, (world_size // ep, ep), mesh_dim_names=("dp", "ep"))
    ep_group, replica_group = mesh.get_group("ep"), mesh.get_group("dp")
    net = copy.deepcopy(make_net()).to(device)
    net.moe = ExpertParallelMoE(net.moe, ep_group)
    experts = set(net.moe.experts.parameters())
    opt = torch.optim.SGD(net.parameters(), lr=LR)
    losses = []
    for step in range(steps):
        x, target = net_batch(step, world_size)
        t = len(x) // world_size
        x, target = x[rank * t:(rank + 1) * t].to(device), target[rank * t:(rank + 1) * t].to(device)
        opt.zero_grad()
        loss = nn.functional.mse_loss(net(x), target)
        loss.backward()
        for p in net.parameters():
            if p.grad is None:  # an expert that got no token this step: a zero gradient, so that the
                p.grad = torch.zeros_like(p)  # all-reduce below meets the same tensors on every rank
            dist.all_reduce(p.grad, group=replica_group if p in experts else None)
            p.grad /= world_size
        opt.step()
        total = loss.detach().clone()
        dist.all_reduce(total)
        losses.append(total.item() / world_size)
    state = {n: p.detach().cpu() for n, p in net.named_parameters() if not n.startswith("moe.experts.")}
    for j, expert in enumerate(net.moe.experts):
        state.update({f"moe.experts.{net.moe.first + j}.{n}": p.detach().cpu() for n, p in expert.named_parameters()})
    return {"rank": rank, "losses": losses, "state": state, "ep_group": dist.get_process_group_ranks(ep_group),
            "replicas": dist.get_process_group_ranks(replica_group)}


def train_one_process(world_size: int, steps: int = 3) -> dict:
    """The reference: the whole network on the global batch, a capacity group per rank, plain SGD."""
    net = make_net()
    opt = torch.optim.SGD(net.parameters(), lr=LR)
    losses = []
    for step in range(steps):
        x, target = net_batch(step, world_size)
        opt.zero_grad()
        loss = nn.functional.mse_loss(net(x, groups=world_size), target)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return {"losses": losses, "state": {n: p.detach() for n, p in net.named_parameters()}}


def main(argv: list[str] | None = None) -> None:
    parser = UsageParser(prog=PROG, description=__doc__.splitlines()[0])
    parser.add_argument("--ep", type=int, default=2, help="ranks the experts are split over; divides the world size")
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args(argv)
    for option, value in (("--ep", args.ep), ("--steps", args.steps)):
        if value < 1:
            parser.error(f"{option} must be at least 1, got {value}")
    experts = make_net().moe.num_experts

    def fits(world_size: int) -> int:  # ep_dp_worker's own checks, from torchrun's WORLD_SIZE
        ep = min(args.ep, world_size)
        groups_of(0, world_size, ep)
        if experts % ep:
            raise ValueError(f"{experts} experts do not split evenly over an expert-parallel size of {ep}")
        return ep

    # Every rank would refuse the same layout alike: said once, before any group.
    ep = check_world_size(PROG, fits, advice=f"choose --ep a divisor of both torchrun's --nproc-per-node "
                                             f"and the {experts} experts")
    with exit_on_interrupt(PROG, "nothing was saved; run it again"), distributed() as (info, _):
        result = ep_dp_worker(info.rank, info.world_size, ep, args.steps)
        results = [None] * info.world_size
        dist.all_gather_object(results, result)
    if info.is_main:
        reference = train_one_process(info.world_size, args.steps)
        diff = max((r["state"][n] - p).abs().max().item() for r in results for n, p in r["state"].items()
                   for p in [reference["state"][n]])
        print(f"losses {[round(v, 4) for v in result['losses']]} (one process: "
              f"{[round(v, 4) for v in reference['losses']]})")
        ok = diff < TOLERANCE
        verdict(ok, f"{args.steps} steps with experts over {ep} of "
                    f"{info.world_size} rank(s) equal one process on the global batch, weights to {TOLERANCE:g}")


if __name__ == "__main__":
    main()
