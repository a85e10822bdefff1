"""Expert parallelism: the experts split over ranks, tokens sent to them and back with all-to-all (``21_expert_parallel``).

With ``E`` experts on ``n`` ranks, rank ``r`` holds experts ``r*E/n .. (r+1)*E/n`` and a copy
of the router; every rank routes its own tokens. Then, per layer:

1. **counts**: how many tokens this rank sends to each expert, exchanged with one
   ``all_to_all_single`` of equal parts (``E/n`` counts to each rank), so that every rank
   knows how many rows it will receive from each peer: the split sizes of the next step;
2. **dispatch**: the tokens, sorted by expert (so by the rank that owns it), go out with
   ``all_to_all_single`` and those uneven split sizes;
3. **compute**: each local expert runs on the rows that came for it;
4. **combine**: the results return with the transposed split sizes, and each is weighted by
   its gate and added at its token's place, in the original order.

``AllToAll`` makes the exchange differentiable: backward is the same exchange, reversed, so
an expert's gradient sums the contributions of every rank's tokens. The router is replicated:
its gradients are averaged like DDP's, and the experts' divided by ``n`` (they already hold
the sum over the ranks' mean losses). Then every gradient is the one-process gradient of the
mean loss over the global batch (``one_process``).

    torchrun --nproc-per-node=2 -m ddp_tutorial.expert_parallel.dispatch
    torchrun --nproc-per-node=4 -m ddp_tutorial.expert_parallel.dispatch --scenario "idle expert"
    python -m ddp_tutorial.expert_parallel.dispatch --capacity-factor 1.0   # a world of one
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from ddp_tutorial.env import distributed, rank_device
from ddp_tutorial.expert_parallel.routing import (
    SCENARIOS,
    MoESetup,
    capacity,
    expert_counts,
    keep_mask,
    make_moe,
    moe_batch,
    top_k_gates,
)
from ddp_tutorial.launch.errors import UsageParser, check_world_size, exit_on_interrupt
from ddp_tutorial.launch.verdict import verdict
from ddp_tutorial.models import MixtureOfExperts

__all__ = ["TOLERANCE", "AllToAll", "all_to_all", "exchange_counts", "Dispatched", "dispatch", "combine",
           "ExpertParallelMoE", "finish_gradients", "ep_worker", "one_process", "compare", "main"]

PROG = "python -m ddp_tutorial.expert_parallel.dispatch"

# float32: the experts' sums run in another order than in one process (gathered rows, index_add);
# differences seen are below 1e-7, 1e-6 is ten steps of the last digit for values of order 1.
TOLERANCE = 1e-6


class AllToAll(torch.autograd.Function):
    """``dist.all_to_all_single`` with split sizes; backward sends the gradients back the way they came."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, send: list[int], recv: list[int], group: dist.ProcessGroup | None) -> torch.Tensor:
        ctx.send, ctx.recv, ctx.group = send, recv, group
        out = x.new_empty((sum(recv), *x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), output_split_sizes=recv, input_split_sizes=send, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        back = grad.new_empty((sum(ctx.send), *grad.shape[1:]))  # the sizes swap: what I received, I send back
        dist.all_to_all_single(back, grad.contiguous(), output_split_sizes=ctx.send, input_split_sizes=ctx.recv,
                               group=ctx.group)
        return back, None, None, None


def all_to_all(x: torch.Tensor, send: list[int], recv: list[int], group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Rows ``x`` cut by ``send`` (one count per rank) out, ``sum(recv)`` rows in; differentiable."""
    return AllToAll.apply(x, send, recv, group)


def exchange_counts(counts: torch.Tensor, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """``counts[e]``, the tokens I send to expert ``e``, in; ``received[src, j]`` out: what rank ``src``
    sends to my ``j``-th expert. Equal parts (``E/n`` counts per rank): lesson 05's all-to-all."""
    n = dist.get_world_size(group)
    received = torch.empty_like(counts)
    dist.all_to_all_single(received, counts, group=group)
    return received.view(n, -1)


@dataclass
class Dispatched:
    """What ``combine`` needs to bring the rows home: where they came from and how many went where."""

    token: torch.Tensor  # the token of each sent row, in sending order
    gate: torch.Tensor  # its gate
    send: list[int]  # rows sent to each rank
    recv: list[int]  # rows received from each rank
    received_counts: torch.Tensor  # (n, experts per rank): rows from each rank for each of my experts


def dispatch(x: torch.Tensor, chosen: torch.Tensor, gates: torch.Tensor, keep: torch.Tensor, num_experts: int,
             group: dist.ProcessGroup | None = None) -> tuple[torch.Tensor, Dispatched]:
    """Send each kept (token, expert) pair's row to the expert's rank: ``(rows received, plan)``."""
    n = dist.get_world_size(group)
    k = chosen.shape[1]
    token = torch.arange(len(x), device=x.device).repeat_interleave(k)[keep.reshape(-1)]
    expert, gate = chosen.reshape(-1)[keep.reshape(-1)], gates.reshape(-1)[keep.reshape(-1)]
    order = torch.argsort(expert, stable=True)  # by expert, so by owner rank; token order within
    token, expert, gate = token[order], expert[order], gate[order]
    counts = torch.bincount(expert, minlength=num_experts)
    received_counts = exchange_counts(counts, group)  # step 1: the split sizes, before the rows
    send, recv = counts.view(n, -1).sum(dim=1).tolist(), received_counts.sum(dim=1).tolist()
    rows = all_to_all(x[token], send, recv, group)  # step 2: uneven parts
    return rows, Dispatched(token, gate, send, recv, received_counts)


def combine(rows: torch.Tensor, plan: Dispatched, tokens: int, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Step 4: the experts' rows home (sizes swapped), weighted by their gates, added at their tokens."""
    back = all_to_all(rows, plan.recv, plan.send, group)
    out = back.new_zeros((tokens, back.shape[1]))
    return out.index_add(0, plan.token, plan.gate[:, None] * back)


class ExpertParallelMoE(nn.Module):
    """``MixtureOfExperts`` with its experts split over ``group``'s ranks and the router replicated.

    Built from the whole layer, so every rank starts from its very weights.
    """

    def __init__(self, full: MixtureOfExperts, group: dist.ProcessGroup | None = None):
        super().__init__()
        self.group, self.top_k, self.num_experts = group, full.top_k, full.num_experts
        self.capacity_factor, self.normalize_topk = full.capacity_factor, full.normalize_topk
        self.first_choices_first, self.selection_bias = full.first_choices_first, full.selection_bias
        n, rank = dist.get_world_size(group), dist.get_rank(group)
        if self.num_experts % n:
            raise ValueError(f"{self.num_experts} experts do not split evenly over {n} ranks")
        self.per_rank = self.num_experts // n
        self.first = rank * self.per_rank  # my experts: first .. first + per_rank
        self.router = copy.deepcopy(full.router)
        self.experts = nn.ModuleList(copy.deepcopy(full.experts[self.first + j]) for j in range(self.per_rank))
        self.last: dict = {}  # what the last forward sent and received: counts for the lesson

    def forward(self, x: torch.Tensor, groups: int | None = None) -> torch.Tensor:
        """``x``: this rank's tokens (tokens, dim). ``groups`` is ignored: each rank is its own capacity
        group; it is there so that the layer can stand in for ``MixtureOfExperts``."""
        _, chosen, gates = top_k_gates(self.router(x), self.top_k, self.normalize_topk,
                                       selection_bias=self.selection_bias)
        limit = capacity(len(x), self.top_k, self.num_experts, self.capacity_factor)
        keep = keep_mask(chosen, self.num_experts, limit, first_choices_first=self.first_choices_first)
        rows, plan = dispatch(x, chosen, gates, keep, self.num_experts, self.group)
        done = self.local_experts(rows, plan.received_counts)
        self.last = {"sent": expert_counts(chosen, keep, self.num_experts).cpu(),
                     "dropped": int((~keep).sum()), "received": plan.received_counts.cpu()}
        return combine(done, plan, len(x), self.group)

    def local_experts(self, rows: torch.Tensor, received_counts: torch.Tensor) -> torch.Tensor:
        """Step 3: each of my experts on the rows that came for it; ``received_counts[src, j]`` rows
        from rank ``src`` for my ``j``-th expert, in that order."""
        mine = torch.arange(self.per_rank, device=rows.device).repeat(len(received_counts))  # (src, expert) blocks ...
        mine = mine.repeat_interleave(received_counts.reshape(-1).to(rows.device))  # ... one expert index per row
        # Zeros that depend on the rows, and need a gradient: even when my experts got no row, both
        # all-to-alls stay in the graph, for their backward is a collective every peer waits in (a hang).
        done = rows * 0
        if torch.is_grad_enabled() and not done.requires_grad:
            done.requires_grad_()
        for j, expert in enumerate(self.experts):
            at = torch.nonzero(mine == j).flatten()
            if len(at):
                done = done.index_copy(0, at, expert(rows[at]))
        return done


def finish_gradients(model: ExpertParallelMoE, group: dist.ProcessGroup | None = None) -> None:
    """After backward: the router's gradient averaged over the ranks (DDP), the experts' divided by ``n``."""
    n = dist.get_world_size(group)
    for p in model.router.parameters():
        dist.all_reduce(p.grad, group=group)
        p.grad /= n
    for p in model.experts.parameters():
        if p.grad is not None:  # an expert that got no token has no gradient, in one process too
            p.grad /= n


def ep_worker(rank: int, world_size: int, setup: MoESetup = MoESetup()) -> dict:
    """One forward and backward of the layer split over all ranks, on this rank's rows of the global batch.

    Returns the output, the router's gradient, my experts' gradients by global index, the counts
    sent and received, and the all-to-alls counted in forward and in backward.
    """
    from torch.distributed.tensor.debug import CommDebugMode

    device = rank_device()  # cuda:LOCAL_RANK under nccl: the all-to-alls need the rows there
    model = ExpertParallelMoE(make_moe(setup).to(device))
    x, target = moe_batch(setup, world_size)
    mine = slice(rank * setup.tokens_per_rank, (rank + 1) * setup.tokens_per_rank)
    x, target = x[mine].to(device).requires_grad_(), target[mine].to(device)  # as an earlier layer's output
    with CommDebugMode() as forward_comms:
        out = model(x)
    loss = nn.functional.mse_loss(out, target)  # this rank's mean, as a DDP rank computes it
    with CommDebugMode() as backward_comms:
        loss.backward()
    finish_gradients(model)
    grads = {f"experts.{model.first + j}.{name}": p.grad.cpu()
             for j, expert in enumerate(model.experts) for name, p in expert.named_parameters() if p.grad is not None}
    return {"rank": rank, "output": out.detach().cpu(), "input_grad": x.grad.cpu(), "router_grad": model.router.weight.grad.cpu(),
            "expert_grads": grads, **model.last,
            "collectives": {"forward": forward_comms.get_total_counts(), "backward": backward_comms.get_total_counts()}}


def one_process(setup: MoESetup = MoESetup(), world_size: int = 1) -> dict:
    """The whole layer on the global batch in one process, a capacity group per rank: the reference."""
    full = make_moe(setup)
    x, target = moe_batch(setup, world_size)
    x.requires_grad_()
    out = full(x, groups=world_size)
    nn.functional.mse_loss(out, target).backward()
    return {"output": out.detach(), "input_grad": x.grad, "router_grad": full.router.weight.grad,
            "expert_grads": {f"experts.{n}": p.grad for n, p in full.experts.named_parameters() if p.grad is not None}}


def compare(results: list[dict], reference: dict) -> dict[str, float]:
    """The largest difference to one process of the outputs and input gradients (stacked by rank), router
    and expert gradients. A rank's loss is the mean over its own rows: its input gradient is ``n`` times
    the one over the global batch."""
    output = torch.cat([r["output"] for r in results])
    input_grad = torch.cat([r["input_grad"] for r in results]) / len(results)
    router = max((r["router_grad"] - reference["router_grad"]).abs().max().item() for r in results)
    got = {name: g for r in results for name, g in r["expert_grads"].items()}
    if got.keys() != reference["expert_grads"].keys():  # an expert with a gradient on one side only
        return {"output": 0.0, "input_grads": 0.0, "router_grads": router, "expert_grads": float("inf")}
    experts = max([(got[name] - g).abs().max().item() for name, g in reference["expert_grads"].items()], default=0.0)
    return {"output": (output - reference["output"]).abs().max().item(),
            "input_grads": (input_grad - reference["input_grad"]).abs().max().item(), "router_grads": router,
            "expert_grads": experts}


def main(argv: list[str] | None = None) -> None:
    parser = UsageParser(prog=PROG, description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", choices=SCENARIOS, default="random")
    parser.add_argument("--top-k", type=int, default=2)
    parser.add_argument("--capacity-factor", type=float, default=None, help="default: no capacity limit")
    parser.add_argument("--experts", type=int, default=4, help="a multiple of the world size")
    args = parser.parse_args(argv)
    for option, value in (("--experts", args.experts), ("--top-k", args.top_k)):
        if value < 1:
            parser.error(f"{option} must be at least 1, got {value}")
    if args.top_k > args.experts:
        parser.error(f"--top-k {args.top_k} chooses more experts than there are (--experts {args.experts})")
    if args.capacity_factor is not None and not (math.isfinite(args.capacity_factor) and args.capacity_factor > 0):
        parser.error(f"--capacity-factor must be a positive finite number, got {args.capacity_factor}")

    def fits(world_size: int) -> None:  # ExpertParallelMoE's own check, from torchrun's WORLD_SIZE
        if args.experts % world_size:
            raise ValueError(f"{args.experts} experts do not split evenly over {world_size} ranks")

    # Every rank would refuse an uneven split alike: said once, before any group.
    check_world_size(PROG, fits, advice="choose --experts a multiple of torchrun's --nproc-per-node")
    with exit_on_interrupt(PROG, "nothing was saved; run it again"), distributed() as (info, _):
        setup = MoESetup(args.scenario, args.top_k, args.capacity_factor, args.experts)
        result = ep_worker(info.rank, info.world_size, setup)
        results = [None] * info.world_size
        dist.all_gather_object(results, result)
    if info.is_main:
        diff = compare(results, one_process(setup, info.world_size))
        for r in results:
            print(f"rank {r['rank']} sends to experts {r['sent'].tolist()}, drops {r['dropped']}")
        ok = max(diff.values()) < TOLERANCE
        verdict(ok, f"{args.experts} experts over {info.world_size} rank(s) ({args.scenario}) "
                    f"equal one process, outputs and gradients to {TOLERANCE:g}")


if __name__ == "__main__":
    main()
