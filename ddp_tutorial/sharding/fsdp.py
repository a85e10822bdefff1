"""FSDP2: every rank keeps 1/N of the parameters too, and gathers a layer only while it computes (``14_sharding``).

``fully_shard(module)`` replaces each parameter by a ``DTensor`` sharded on dim 0 over the
mesh: rank r keeps rows r/N of every weight (``param.to_local()``). Each module passed to
``fully_shard`` is one *unit*: its parameters are all-gathered together just before its
forward (and again before its backward) and freed afterwards, and its gradients are
reduce-scattered as soon as its backward is done. Here each transformer block is a unit,
and the root (embedding, final norm, head) is one more:

- forward of block i: gather block i, compute, free it (``reshard_after_forward=True``);
  with ``False`` it stays gathered until its backward (ZeRO-2-like: no second gather,
  more memory);
- backward of block i: gather it again, compute, reduce-scatter its gradients into their
  shards, free it (FSDP2 starts the next block's all-gather early, to overlap: prefetch);
- the optimizer sees only the shards: its state is sharded too (ZeRO-3).

On gloo a reduce-scatter is emulated by an all-reduce of the whole buffer (pytorch#118911,
#149869): this lesson is about memory, not speed.

    torchrun --nproc-per-node=2 -m ddp_tutorial.sharding.fsdp
    python -m ddp_tutorial.sharding.fsdp          # alone: a world of one
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor

from ddp_tutorial.env import distributed, rank_device
from ddp_tutorial.launch.verdict import verdict
from ddp_tutorial.models import TinyTransformer, token_batch
from ddp_tutorial.sharding.memory import held
from ddp_tutorial.sharding.zero import TOLERANCE
from ddp_tutorial.sharding.zero import footprints as zero_footprints

__all__ = ["shard_model", "unit_bytes", "unsharded_timeline", "phases", "gradients_vs_ddp", "train_vs_one_process",
           "footprints", "all_footprints", "FORCE_SUM_AVAILABLE"]

# FSDPModule.set_force_sum_reduction_for_comms (pytorch#155915): SUM collectives, FSDP divides itself.
FORCE_SUM_AVAILABLE = hasattr(FSDPModule, "set_force_sum_reduction_for_comms")


def shard_model(model: TinyTransformer, reshard_after_forward: bool = True) -> TinyTransformer:
    """``fully_shard`` each block (a unit each), then the root (embedding, final norm, head), on all ranks.

    The root keeps its parameters gathered from forward to backward whatever the flag
    (backward starts with it); ``reshard_after_forward`` applies to the blocks.
    """
    mesh = init_device_mesh(rank_device().type, (dist.get_world_size(),))
    for block in model.blocks:
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=mesh)
    return model


def unit_bytes(model: TinyTransformer) -> dict[str, int]:
    """Bytes of each unit's full (gathered) parameters: ``root`` and ``blocks.i``."""
    def nbytes(params) -> int:
        return sum(p.numel() * p.element_size() for p in params)

    blocks = {f"blocks.{i}": nbytes(b.parameters()) for i, b in enumerate(model.blocks)}
    return {"root": nbytes(model.parameters()) - sum(blocks.values()), **blocks}


def _gathered(model: nn.Module) -> list[str]:
    """The units whose parameters are gathered right now (FSDP2 swaps in plain tensors for DTensors)."""
    units = [("root", model.embed)] + [(f"blocks.{i}", b.qkv) for i, b in enumerate(model.blocks)]
    return [name for name, module in units if not isinstance(module.weight, DTensor)]


def _watch(model: nn.Module, events: list) -> list:
    """Hooks that append ``(phase, layer, gathered units)`` to ``events`` as each layer's forward
    ends and as its backward starts; returns the handles."""
    def record(name: str, output: torch.Tensor) -> None:
        events.append(("forward", name, _gathered(model)))
        # Fires when the gradient of this output is ready: this layer's backward starts.
        output.register_hook(lambda grad: events.append(("backward", name, _gathered(model))))

    leaves = [(n, m) for n, m in model.named_modules() if not list(m.children())]
    return [m.register_forward_hook(lambda mod, args, out, n=n: record(n, out)) for n, m in leaves]


def unsharded_timeline(rank: int, world_size: int, reshard_after_forward: bool = True) -> list[tuple[str, str, list[str]]]:
    """One training step of a sharded ``TinyTransformer``, watched: ``(phase, layer, gathered units)``
    as each layer's forward ends and as its backward starts, and after the optimizer step."""
    device = rank_device()
    torch.manual_seed(0)
    model = shard_model(TinyTransformer().to(device), reshard_after_forward)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    events = [("before", "forward", _gathered(model))]
    handles = _watch(model, events)
    tokens, targets = token_batch(0, world_size, rank, device=device)
    nn.functional.cross_entropy(model(tokens), targets).backward()
    optimizer.step()
    events.append(("after", "step", _gathered(model)))
    for h in handles:
        h.remove()
    dist.barrier()  # see gradients_vs_ddp
    return events


def phases(events: list[tuple[str, str, list[str]]]) -> list[tuple[str, str, list[str]]]:
    """Consecutive events with the same phase and gathered units, merged: ``(phase, "first .. last", units)``."""
    merged: list[list] = []
    for phase, layer, units in events:
        if merged and merged[-1][0] == phase and merged[-1][3] == units:
            merged[-1][2] = layer
        else:
            merged.append([phase, layer, layer, units])
    return [(p, a if a == b else f"{a} .. {b}", u) for p, a, b, u in merged]


def gradients_vs_ddp(rank: int, world_size: int, force_sum: bool = False, seed: int = 0) -> dict[str, float]:
    """FSDP2's gradients (gathered: ``full_tensor()``) against torch DDP's after one float32 step: the largest
    difference, and the ratio of their norms (1 for a mean; N if the gradients were summed).

    float32 on purpose: FSDP2 reduce-scatters float32 gradients with ``ReduceOp.AVG``, the op
    that some gloo releases summed instead (pytorch#162338): gradients N times too large.
    ``force_sum``: ``set_force_sum_reduction_for_comms(True)``, SUM then FSDP divides by N.
    """
    device = rank_device()
    torch.manual_seed(seed)
    base = TinyTransformer().to(device)
    ddp = nn.parallel.DistributedDataParallel(copy.deepcopy(base))
    fsdp = shard_model(copy.deepcopy(base))
    if force_sum:
        for unit in (fsdp, *fsdp.blocks):  # one setting per unit, not recursive
            unit.set_force_sum_reduction_for_comms(True)
    tokens, targets = token_batch(0, world_size, rank, device=device)
    for model in (ddp, fsdp):
        nn.functional.cross_entropy(model(tokens), targets).backward()
    pairs = [(a.grad, b.grad.full_tensor()) for a, b in zip(ddp.parameters(), fsdp.parameters())]
    diff = max((a - b).abs().max().item() for a, b in pairs)
    ratio = (sum(b.square().sum() for _, b in pairs) / sum(a.square().sum() for a, _ in pairs)).sqrt().item()
    # gloo after FSDP2: a rank that tears its group down while a peer is still in FSDP2's
    # last collectives can abort with SIGABRT at exit. spawn destroys the group right after
    # this worker returns (torchrun's distributed() likewise), so wait for everyone here.
    dist.barrier()
    return {"difference": diff, "norm ratio": ratio}


def train_vs_one_process(rank: int, world_size: int, num_steps: int = 3, lr: float = 1e-2,
                         reshard_after_forward: bool = True, seed: int = 0) -> float:
    """FSDP2 + Adam for ``num_steps`` (float64) against one process on the global batch:
    the largest parameter difference, FSDP2's parameters gathered with ``full_tensor()``."""
    device = rank_device()
    torch.manual_seed(seed)
    single = TinyTransformer().to(device, torch.float64)
    fsdp = shard_model(copy.deepcopy(single), reshard_after_forward)
    opt_fsdp = torch.optim.Adam(fsdp.parameters(), lr=lr)  # sees DTensors: its state is sharded too
    opt_single = torch.optim.Adam(single.parameters(), lr=lr)
    for step in range(num_steps):
        for model, opt, share in ((fsdp, opt_fsdp, rank), (single, opt_single, None)):  # None: the global batch
            tokens, targets = token_batch(step, world_size, share, device=device)
            opt.zero_grad()
            nn.functional.cross_entropy(model(tokens), targets).backward()
            opt.step()
    diff = max((a.full_tensor() - b).abs().max().item() for a, b in zip(fsdp.parameters(), single.parameters()))
    dist.barrier()  # see gradients_vs_ddp
    return diff


def footprints(rank: int, world_size: int, model_kwargs: dict | None = None, lr: float = 1e-2) -> dict:
    """FSDP2's bytes on this rank after one float32 Adam step, from the local shards (``"FSDP2"``); each
    unit's full parameter bytes (``"units"``); the most parameter bytes gathered at once during the step
    (``"gathered"``: the root and one block); and ``"peak"``: the shards plus those gathered parameters
    and their full gradients."""
    device = rank_device()
    torch.manual_seed(0)
    model = TinyTransformer(**(model_kwargs or {})).to(device)
    units = unit_bytes(model)
    shard_model(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    tokens, targets = token_batch(0, world_size, rank, vocab=model.vocab, device=device)
    events: list = []
    handles = _watch(model, events)
    nn.functional.cross_entropy(model(tokens), targets).backward()
    optimizer.step()
    for h in handles:
        h.remove()
    steady = held(model.parameters(), optimizer)  # DTensors: to_local(), this rank's rows only
    gathered = max(sum(units[u] for u in gathered_units) for _, _, gathered_units in events)
    dist.barrier()  # see gradients_vs_ddp
    # At the worst moment (a block's backward) the gathered units' full gradients exist too, until
    # their reduce-scatter: twice the gathered parameters on top of the shards. Not counted: the
    # activations, and the next block's all-gather buffer when FSDP2 prefetches it.
    return {"FSDP2": steady, "units": units, "gathered": gathered, "peak": steady.total + 2 * gathered}


def all_footprints(rank: int, world_size: int, model_kwargs: dict | None = None) -> dict:
    """Every strategy's ``Footprint`` on this rank: DDP, ZeRO-1, ZeRO-2, ZeRO-1 (torch) (``zero.footprints``)
    and FSDP2 with its ``"units"``, ``"gathered"`` and ``"peak"`` (``footprints``)."""
    return {**zero_footprints(rank, world_size, model_kwargs), **footprints(rank, world_size, model_kwargs)}


def main() -> None:
    with distributed() as (info, _):
        n = info.world_size
        grads = gradients_vs_ddp(info.rank, n)
        grad_diff = grads["difference"]
        param_diff = train_vs_one_process(info.rank, n)
        fp = footprints(info.rank, n)
        ok = grad_diff < 1e-6 and abs(grads["norm ratio"] - 1) < 1e-6 and param_diff < TOLERANCE
        if info.is_main:
            print(f"FSDP2 gradients vs DDP's (float32): {grad_diff:.1e}; parameters after 3 Adam steps vs "
                  f"one process on the global batch (float64): {param_diff:.1e}")
            f = fp["FSDP2"]
            print(f"FSDP2 on {n} rank(s): params {f.params} B, grads {f.grads} B, optimizer state {f.optim} B "
                  f"per rank; units {fp['units']}; peak {fp['peak']} B with {fp['gathered']} B gathered")
        verdict(ok, f"FSDP2 equals DDP and one process, {n} rank(s)", show=info.is_main)


if __name__ == "__main__":
    main()
