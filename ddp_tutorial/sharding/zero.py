"""ZeRO from scratch: shard the optimizer state (ZeRO-1), then the gradients (ZeRO-2) (``14_sharding``).

DDP keeps everything on every rank. But Adam is elementwise: the update of element i
needs only element i's parameter, gradient and two states. So each of N ranks can own
one slice of 1/N of all elements and keep Adam's state for that slice only:

1. backward as usual: every rank has its own full gradients;
2. ``reduce_scatter_single``: rank r receives slice r of the *summed* gradients (divided
   by N: the mean, as DDP);
3. Adam updates slice r of the parameters (state for 1/N of the elements);
4. ``all_gather_single``: every rank receives every updated slice.

A reduce-scatter plus an all-gather move as many bytes as one all-reduce (a ring
all-reduce *is* the two, lesson 06), so ZeRO-1 costs DDP's communication. With
``stage=2`` (ZeRO-2-style) a rank also drops its full gradients once they are
reduced and keeps only its slice. Real ZeRO-2 (DeepSpeed) reduce-scatters bucket by
bucket during backward, so the full gradients never exist at once; here they exist
until ``step``, and the lesson counts what a rank keeps afterwards.

``torch.distributed.optim.ZeroRedundancyOptimizer`` shards differently: it assigns
whole parameters to ranks, greedily, largest first (``greedy_assignment``), so the
slices are uneven, and it all-reduces gradients (DDP does) instead of reduce-scattering.

    torchrun --nproc-per-node=2 -m ddp_tutorial.sharding.zero
    python -m ddp_tutorial.sharding.zero          # alone: a world of one
"""

from __future__ import annotations

import copy
from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.optim import ZeroRedundancyOptimizer

from ddp_tutorial.comm.collectives import all_gather_single, reduce_scatter_single
from ddp_tutorial.env import distributed, rank_device
from ddp_tutorial.launch.verdict import verdict
from ddp_tutorial.models import TinyTransformer, token_batch
from ddp_tutorial.sharding.memory import Footprint, held, optimizer_state_bytes, tensor_bytes

__all__ = ["ShardedOptimizer", "greedy_assignment", "train_side_by_side", "zero_redundancy_vs_adam",
           "footprints", "largest_difference", "TOLERANCE"]

# float64: every comparison in this lesson agrees to 1e-12 or better, except with one process on the
# global batch (its loss sums in another order), near 1e-12: Adam divides by sqrt(v), which magnifies
# rounding in tiny gradients. 1e-10 is far above that and far below a real mistake (a missing /N).
TOLERANCE = 1e-10


class ShardedOptimizer:
    """ZeRO-1 (``stage=1``) or ZeRO-2-style (``stage=2``) around any elementwise optimizer.

    Use it *instead of* DDP: it averages the gradients itself (``reduce_scatter_single``).
    All parameters become views of one flat buffer, padded to N equal slices; rank r's
    ``optimizer_class`` sees only slice r (``self.shard``, a view too, so updating it
    updates the model). Rank 0's weights are broadcast at construction, as DDP does.
    Not for optimizers that look across elements (LAMB's per-tensor norms) or gradient
    clipping by the global norm without an extra all-reduce of the slices' norms.
    """

    def __init__(self, params: Iterable[torch.Tensor], optimizer_class: type = torch.optim.Adam, *,
                 stage: int = 1, group: dist.ProcessGroup | None = None, **defaults):
        if stage not in (1, 2):
            raise ValueError(f"stage must be 1 or 2, got {stage}")
        self.params = [p for p in params if p.requires_grad]
        self.stage, self.group = stage, group
        self.world_size, rank = dist.get_world_size(group), dist.get_rank(group)
        self.numel = sum(p.numel() for p in self.params)
        self.shard_numel = -(-self.numel // self.world_size)
        first = self.params[0]
        self.flat = torch.zeros(self.shard_numel * self.world_size, dtype=first.dtype, device=first.device)
        offset = 0
        for p in self.params:
            n = p.numel()
            self.flat[offset:offset + n].copy_(p.detach().reshape(-1))
            p.data = self.flat[offset:offset + n].view_as(p)  # the model's weights now live in self.flat
            offset += n
        dist.broadcast(self.flat, dist.get_global_rank(group, 0) if group else 0, group=group)
        start = rank * self.shard_numel
        self.shard = nn.Parameter(self.flat[start:start + self.shard_numel])
        self.optimizer = optimizer_class([self.shard], **defaults)

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None
        self.shard.grad = None

    @torch.no_grad()
    def step(self) -> None:
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        padding = self.flat.new_zeros(self.flat.numel() - self.numel)
        flat_grad = torch.cat([g.reshape(-1) for g in grads] + [padding])  # a temporary copy
        grad_shard = torch.empty_like(self.shard)
        reduce_scatter_single(grad_shard, flat_grad, group=self.group)  # my slice, summed over ranks
        grad_shard.div_(self.world_size)  # the mean, as DDP
        if self.stage == 2:
            for p in self.params:  # ZeRO-2: the other slices' gradients are the other ranks' business
                p.grad = None
        self.shard.grad = grad_shard
        self.optimizer.step()  # Adam on 1/N of the elements: its state is 1/N of DDP's
        if self.stage == 1:
            self.shard.grad = None  # ZeRO-1 keeps the full gradients (like DDP); the slice was for this update
        # Everyone receives every updated slice. A copy as input is safe; the slice itself would do too
        # (exactly this rank's place in the output: an in-place all-gather, as FSDP2 does).
        all_gather_single(self.flat, self.shard.detach().clone(), group=self.group)

    def footprint(self) -> Footprint:
        """Bytes this rank holds: the flat parameters, its gradients, its slice of the optimizer state."""
        grads = sum(tensor_bytes(p.grad) for p in self.params) + tensor_bytes(self.shard.grad)
        return Footprint(tensor_bytes(self.flat), grads, optimizer_state_bytes(self.optimizer))


def greedy_assignment(numels: list[int], world_size: int) -> list[list[int]]:
    """Which parameters (indices into ``numels``) each rank gets, the way ``ZeroRedundancyOptimizer``
    assigns them: largest first, each to the rank with the fewest elements so far (ties: lowest rank)."""
    ranks: list[list[int]] = [[] for _ in range(world_size)]
    sizes = [0] * world_size
    for i in sorted(range(len(numels)), key=lambda i: numels[i], reverse=True):  # stable: ties keep order
        r = sizes.index(min(sizes))
        ranks[r].append(i)
        sizes[r] += numels[i]
    return ranks


def largest_difference(a: nn.Module, b: nn.Module) -> float:
    """The largest absolute difference between two models' parameters."""
    return max((x.detach().double() - y.detach().double()).abs().max().item()
               for x, y in zip(a.parameters(), b.parameters()))


def _loss(model: nn.Module, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(model(tokens), targets)


def train_side_by_side(rank: int, world_size: int, stage: int = 1, num_steps: int = 3, lr: float = 1e-2,
                       dtype: torch.dtype = torch.float64, seed: int = 0) -> dict[str, float]:
    """Train ``ShardedOptimizer(Adam)``, torch DDP + Adam, and one process on the global batch side by side.

    Each rank builds its model from its own seed on purpose: the broadcasts at construction
    must make them equal (the one process starts from rank 0's). Returns the largest
    parameter difference from DDP and from the one process after ``num_steps`` steps.
    """
    device = rank_device()
    torch.manual_seed(seed + rank)
    base = TinyTransformer().to(device, dtype)
    torch.manual_seed(seed)
    single = TinyTransformer().to(device, dtype)
    ddp = nn.parallel.DistributedDataParallel(copy.deepcopy(base))
    ours = copy.deepcopy(base)
    zero = ShardedOptimizer(ours.parameters(), torch.optim.Adam, stage=stage, lr=lr)
    adam_ddp, adam_single = torch.optim.Adam(ddp.parameters(), lr=lr), torch.optim.Adam(single.parameters(), lr=lr)
    for step in range(num_steps):
        tokens, targets = token_batch(step, world_size, rank, device=device)
        for model, opt in ((ddp, adam_ddp), (ours, zero)):
            opt.zero_grad()
            _loss(model, tokens, targets).backward()
            opt.step()
        adam_single.zero_grad()
        _loss(single, *token_batch(step, world_size, device=device)).backward()
        adam_single.step()
    return {"DDP": largest_difference(ours, ddp.module), "one process": largest_difference(ours, single)}


def zero_redundancy_vs_adam(rank: int, world_size: int, num_steps: int = 3, lr: float = 1e-2,
                            dtype: torch.dtype = torch.float64, seed: int = 0, model_kwargs: dict | None = None) -> dict:
    """DDP + ``ZeroRedundancyOptimizer(Adam)`` next to DDP + Adam.

    Returns the largest parameter difference after ``num_steps``, the names and element counts
    of the parameters whose Adam state this rank holds, and that state's bytes.
    """
    device = rank_device()
    torch.manual_seed(seed)
    base = TinyTransformer(**(model_kwargs or {})).to(device, dtype)
    ref, ddp = (nn.parallel.DistributedDataParallel(copy.deepcopy(base)) for _ in range(2))
    adam = torch.optim.Adam(ref.parameters(), lr=lr)
    zero = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.Adam, lr=lr)
    for step in range(num_steps):
        tokens, targets = token_batch(step, world_size, rank, vocab=base.vocab, device=device)
        for model, opt in ((ref, adam), (ddp, zero)):
            opt.zero_grad()
            _loss(model, tokens, targets).backward()
            opt.step()  # ZeroRedundancyOptimizer: update my parameters, then broadcast them to all
    mine = {id(p) for group in zero.optim.param_groups for p in group["params"]}  # zero.optim: this rank's Adam
    owned = [(name, p.numel()) for name, p in ddp.module.named_parameters() if id(p) in mine]
    return {"difference": largest_difference(ddp.module, ref.module), "owned": owned,
            "state_bytes": optimizer_state_bytes(zero.optim)}


def footprints(rank: int, world_size: int, model_kwargs: dict | None = None, lr: float = 1e-2) -> dict[str, Footprint]:
    """Bytes this rank holds after one float32 Adam step: DDP, ZeRO-1, ZeRO-2-style (ours), and
    ``ZeroRedundancyOptimizer`` (``"ZeRO-1 (torch)"``), each measured from its real tensors."""
    device = rank_device()
    torch.manual_seed(0)
    base = TinyTransformer(**(model_kwargs or {})).to(device)
    tokens, targets = token_batch(0, world_size, rank, vocab=base.vocab, device=device)
    result = {}
    for name in ("DDP", "ZeRO-1", "ZeRO-2", "ZeRO-1 (torch)"):
        model = copy.deepcopy(base)
        if name.startswith("ZeRO-") and "torch" not in name:
            opt = ShardedOptimizer(model.parameters(), torch.optim.Adam, stage=int(name[-1]), lr=lr)
        else:
            model = nn.parallel.DistributedDataParallel(model)
            opt = (ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam, lr=lr)
                   if "torch" in name else torch.optim.Adam(model.parameters(), lr=lr))
        opt.zero_grad()
        _loss(model, tokens, targets).backward()
        opt.step()
        if isinstance(opt, ShardedOptimizer):
            result[name] = opt.footprint()
        else:
            state = opt.optim if isinstance(opt, ZeroRedundancyOptimizer) else opt
            result[name] = held(model.parameters(), state)
    return result


def main() -> None:
    with distributed() as (info, _):
        n = info.world_size
        diffs = {f"ZeRO-{stage}": train_side_by_side(info.rank, n, stage) for stage in (1, 2)}
        torch_zero = zero_redundancy_vs_adam(info.rank, n)
        held_bytes = footprints(info.rank, n)
        ok = all(d < TOLERANCE for per in diffs.values() for d in per.values()) and torch_zero["difference"] < TOLERANCE
        owned = [None] * n
        dist.all_gather_object(owned, torch_zero["owned"])
        if info.is_main:
            for name, per in diffs.items():
                print(f"{name} from scratch after 3 Adam steps on {n} rank(s): largest difference from "
                      + ", ".join(f"{ref} {d:.1e}" for ref, d in per.items()))
            print(f"ZeroRedundancyOptimizer vs DDP + Adam: {torch_zero['difference']:.1e}; "
                  f"elements per rank: {[sum(k for _, k in o) for o in owned]}")
            for name, fp in held_bytes.items():
                print(f"{name:>15}: params {fp.params:>6} B, grads {fp.grads:>6} B, optimizer state {fp.optim:>6} B")
        verdict(ok, f"ZeRO from scratch and ZeroRedundancyOptimizer equal DDP + Adam, {n} rank(s)", show=info.is_main)


if __name__ == "__main__":
    main()
