"""ZeRO-3 from scratch against one process, and what a rank holds while it trains (``18_zero3_and_checkpoints``).

The references are computed another way, in one process with every weight whole:

- float32: the global batch in one process and Adam; or, to the last bit, the ranks'
  micro-batches one after the other (each loss divided by N) so the gradients are summed in
  the order a 2-rank reduce-scatter sums them (``a + b`` is ``b + a`` in floating point; with
  4 ranks the order of gloo's sum is its own, so there the comparison has a tolerance);
- bfloat16/float16: one process that casts the float32 weights to the compute dtype each
  step, computes in it, and updates float32 masters (``mixed_precision_step``).

    torchrun --nproc-per-node=2 -m ddp_tutorial.sharding.zero3_train
    python -m ddp_tutorial.sharding.zero3_train          # alone: a world of one
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from ddp_tutorial.env import distributed, rank_device
from ddp_tutorial.launch.verdict import verdict
from ddp_tutorial.models import TinyTransformer, token_batch
from ddp_tutorial.sharding.zero3 import Zero3

__all__ = ["mixed_precision_step", "train_vs_one_process", "side_by_side", "timeline", "unit_bytes", "peak_formula", "largest_gap",
           "TOLERANCES", "passed"]

# Largest parameter difference from one process on the global batch after 3 SGD steps (lr 0.1),
# measured about 10x below: float32, another summation order (6e-8); float16 (11 bits of mantissa,
# 1e-5) and bfloat16 (8 bits, 1e-4): the global batch's activations round differently from each
# rank's. Adam is compared to the last bit only (2 ranks, rank order): its 1/sqrt(v) turns a
# rounding difference in a near-zero gradient into a whole step of lr (4e-4 with another order).
TOLERANCES = {None: 1e-6, torch.float16: 2e-4, torch.bfloat16: 1e-3}


def mixed_precision_step(model: nn.Module, optimizer: torch.optim.Optimizer, tokens: torch.Tensor,
                         targets: torch.Tensor, compute_dtype: torch.dtype | None) -> None:
    """One step in one process: a copy of the float32 weights cast to ``compute_dtype`` computes,
    its gradients (cast to float32) update ``model``'s masters."""
    work = copy.deepcopy(model).to(compute_dtype or torch.float32)
    nn.functional.cross_entropy(work(tokens).float(), targets).backward()
    optimizer.zero_grad()
    for master, p in zip(model.parameters(), work.parameters()):
        master.grad = p.grad.float()
    optimizer.step()


def largest_gap(full: dict[str, torch.Tensor], model: nn.Module) -> float:
    """The largest absolute difference between ``gather_full_params()`` and a model's parameters."""
    return max((full[name].double() - p.detach().double()).abs().max().item() for name, p in model.named_parameters())


def train_vs_one_process(rank: int, world_size: int, compute_dtype: torch.dtype | None = None, *,
                         optimizer: type = torch.optim.Adam, num_steps: int = 3, lr: float = 1e-2,
                         seed: int = 0) -> dict:
    """``Zero3`` + Adam for ``num_steps`` next to one process: the largest gap from the global batch
    (``"global batch"``) and, in float32, from the micro-batches in rank order (``"rank order"``);
    the all-gathers issued per step; the peak bytes gathered at once and the formula's bound."""
    device = rank_device()
    torch.manual_seed(seed)
    single = TinyTransformer().to(device)
    in_order = copy.deepcopy(single)
    zero3 = Zero3(copy.deepcopy(single), compute_dtype)
    optimizers = [optimizer(m.parameters(), lr=lr) for m in (zero3, single, in_order)]
    gathers = []
    for step in range(num_steps):
        before = zero3.gathers
        tokens, targets = token_batch(step, world_size, rank, device=device)
        optimizers[0].zero_grad()
        nn.functional.cross_entropy(zero3(tokens).float(), targets).backward()
        zero3.finish_gradient_synchronization()
        optimizers[0].step()
        gathers.append(zero3.gathers - before)
        mixed_precision_step(single, optimizers[1], *token_batch(step, world_size, device=device), compute_dtype)
        optimizers[2].zero_grad()
        for r in range(world_size):  # the reduce-scatter's sum, in rank order, each rank's mean divided by N
            (nn.functional.cross_entropy(in_order(token_batch(step, world_size, r, device=device)[0]),
                                         token_batch(step, world_size, r, device=device)[1]) / world_size).backward()
        optimizers[2].step()
    full = zero3.gather_full_params()
    return {"global batch": largest_gap(full, single),
            "rank order": largest_gap(full, in_order) if compute_dtype is None else None,
            "gathers per step": gathers, "peak gathered": zero3.peak_gathered_bytes,
            "units": unit_bytes(TinyTransformer(), compute_dtype), "shard bytes": sum(
                p.numel() * p.element_size() for p in zero3.parameters())}


def side_by_side(rank: int, world_size: int, cases: tuple = ((None, "Adam"), (torch.bfloat16, "SGD"))) -> dict:
    """``train_vs_one_process`` for each ``(compute_dtype, optimizer name)`` in ``cases`` (one launch for
    them all); Adam with lr 1e-2, SGD with lr 0.1. Returns ``{case: result}``."""
    lrs = {"Adam": 1e-2, "SGD": 0.1}
    return {(dtype, name): train_vs_one_process(rank, world_size, dtype, optimizer=getattr(torch.optim, name),
                                                lr=lrs[name]) for dtype, name in cases}


def timeline(rank: int, world_size: int, num_steps: int = 2) -> list[tuple[str, str, str]]:
    """``Zero3.timeline`` of the last of ``num_steps`` steps (the first records the order, so it cannot
    prefetch): ``(phase, event, unit)`` in the order they happened."""
    torch.manual_seed(0)
    model = Zero3(TinyTransformer().to(rank_device()))
    for step in range(num_steps):
        tokens, targets = token_batch(step, world_size, rank, device=rank_device())
        nn.functional.cross_entropy(model(tokens), targets).backward()
        model.finish_gradient_synchronization()
    return model.timeline


def unit_bytes(model: nn.Module, compute_dtype: torch.dtype | None = None) -> list[int]:
    """Bytes of each unit's full sharded weights (2+ dimensions) in ``compute_dtype``, in forward order
    (the order ``modules()`` lists them, which is the forward's for the course's models)."""
    size = torch.empty(0, dtype=compute_dtype or torch.float32).element_size()
    units = [[p for p in m.parameters(recurse=False) if p.dim() >= 2] for m in model.modules()]
    return [sum(p.numel() for p in ps) * size for ps in units if ps]


def peak_formula(units: list[int]) -> int:
    """At most two units gathered at once: the one computing and its neighbour (in backward, the next
    unit's weights are gathered as soon as its output's gradient exists, before the first frees)."""
    return max(a + b for a, b in zip(units, units[1:])) if len(units) > 1 else units[0]


def passed(results: dict, world_size: int) -> bool:
    """Every SGD case within ``TOLERANCES`` of the global batch; float32 equal to the last bit in rank
    order where the sum's order is known (2 ranks or fewer)."""
    ok = all(r["global batch"] <= TOLERANCES[dtype] for (dtype, name), r in results.items() if name == "SGD")
    return ok and all(r["rank order"] == 0 for (dtype, _), r in results.items() if dtype is None and world_size <= 2)


def main() -> None:
    cases = ((None, "Adam"), (None, "SGD"), (torch.bfloat16, "SGD"))
    with distributed() as (info, _):
        results = side_by_side(info.rank, info.world_size, cases)
        ok = passed(results, info.world_size)
        if info.is_main:
            for (dtype, name), r in results.items():
                kind = "float32" if dtype is None else str(dtype).replace("torch.", "")
                print(f"Zero3 {kind} + {name} on {info.world_size} rank(s), 3 steps: largest gap from one process "
                      f"{r['global batch']:.1e}" + ("" if r["rank order"] is None else
                                                    f" (rank order: {r['rank order']:.1e})")
                      + f"; peak gathered {r['peak gathered']} B (bound {peak_formula(r['units'])} B)")
        verdict(ok, f"ZeRO-3 from scratch equals one process, {info.world_size} rank(s)", show=info.is_main)


if __name__ == "__main__":
    main()
