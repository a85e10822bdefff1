"""FSDP2 as it is used in practice: no rank ever builds the whole model (``18_zero3_and_checkpoints``).

Lesson 14 built the model whole on every rank, then called ``fully_shard``: the very thing
that does not fit. In practice:

- **meta-device initialisation**: under ``torch.device("meta")`` the model has shapes and no
  bytes; ``fully_shard`` per block then the root shards those shapes; ``to_empty`` allocates
  only this rank's shards; then rank 0's weights are loaded into them (``set_model_state_dict``
  with ``full_state_dict`` and ``broadcast_from_rank0``), or each module's
  ``reset_parameters()`` initialises its shards;
- ``MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)``: the
  all-gathers and the compute in bfloat16, the gradients reduced in float32 into float32 shards:
  what ``Zero3(compute_dtype=torch.bfloat16)`` does by hand;
- gradient accumulation: ``set_requires_gradient_sync(False)`` on all micro-batches but the
  last skips the reduce-scatters (DDP's ``no_sync``), at a price: until the last micro-batch every
  rank keeps the *unsharded* gradient of every parameter, in ``reduce_dtype`` (float32 here), the
  whole model's gradients, which ZeRO-2/3 exist to shard (``accumulation_bytes`` counts them);
- ``reshard_after_forward``: ``True`` frees a block's weights after its forward (gathered again
  for backward), ``False`` keeps them (no second gather, more memory), an int ``k`` keeps them
  sharded over groups of ``k`` ranks in between (a cheaper second gather, within a node).

    torchrun --nproc-per-node=2 -m ddp_tutorial.sharding.fsdp_practice
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from ddp_tutorial.env import distributed, rank_device
from ddp_tutorial.launch.verdict import verdict
from ddp_tutorial.models import TinyTransformer, token_batch
from ddp_tutorial.sharding.memory import held
from ddp_tutorial.sharding.zero3 import Zero3
from ddp_tutorial.sharding.zero3_train import mixed_precision_step
from ddp_tutorial.timing import take_turns

__all__ = ["build_on_meta", "meta_init", "versus_zero3", "accumulate", "gradient_bytes", "accumulation_bytes",
           "reshard_settings", "practice_report", "costs"]


def build_on_meta(reference: dict[str, torch.Tensor] | None, *, mp_policy: MixedPrecisionPolicy | None = None,
                  reshard_after_forward: bool | int = True, model_kwargs: dict | None = None) -> TinyTransformer:
    """A ``TinyTransformer`` created on the meta device, ``fully_shard`` per block and at the root,
    allocated shard by shard, then filled from ``reference`` (a full state dict on rank 0, ignored on
    the others: rank 0 broadcasts it)."""
    with torch.device("meta"):
        model = TinyTransformer(**(model_kwargs or {}))  # shapes only: no rank allocates the whole model
    mesh = init_device_mesh(rank_device().type, (dist.get_world_size(),))
    kwargs = {"mesh": mesh, "mp_policy": mp_policy or MixedPrecisionPolicy()}
    for block in model.blocks:
        fully_shard(block, reshard_after_forward=reshard_after_forward, **kwargs)
    fully_shard(model, **kwargs)
    model.to_empty(device=rank_device())  # this rank's shards, uninitialised
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_model_state_dict(model, reference if dist.get_rank() == 0 else {}, options=options)
    return model


def reference_model(seed: int = 0) -> TinyTransformer:
    torch.manual_seed(seed)
    return TinyTransformer().to(rank_device())


def meta_init(rank: int, world_size: int) -> dict:
    """Bytes of parameters this rank allocates with meta-device initialisation (its shards), the whole
    model's bytes, and whether the gathered weights equal rank 0's reference bit for bit."""
    reference = reference_model()
    model = build_on_meta(reference.state_dict() if rank == 0 else None)
    local = sum(p.to_local().numel() * p.element_size() for p in model.parameters())
    equal = all(torch.equal(p.full_tensor(), q) for p, q in zip(model.parameters(), reference.parameters()))
    dist.barrier()  # see fsdp.gradients_vs_ddp
    return {"local bytes": local, "model bytes": sum(p.numel() * p.element_size() for p in reference.parameters()),
            "equal": equal}


def sgd_steps(model: nn.Module, rank: int, world_size: int, num_steps: int, *, micro: int = 1) -> None:
    """``num_steps`` of SGD (lr 0.1); ``micro`` micro-batches per step, reduced only on the last."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(num_steps):
        optimizer.zero_grad()
        for m in range(micro):
            if hasattr(model, "set_requires_gradient_sync"):
                model.set_requires_gradient_sync(m == micro - 1)  # reduce-scatter on the last one only
            tokens, targets = token_batch(step * micro + m, world_size, rank, device=rank_device())
            (nn.functional.cross_entropy(model(tokens).float(), targets) / micro).backward()
        if isinstance(model, Zero3):
            model.finish_gradient_synchronization()
        optimizer.step()


def full_gap(model: nn.Module, reference: nn.Module) -> float:
    return max((p.full_tensor().float() - q.detach().float()).abs().max().item()
               for p, q in zip(model.parameters(), reference.parameters()))


def versus_zero3(rank: int, world_size: int, num_steps: int = 3) -> dict:
    """FSDP2 with ``MixedPrecisionPolicy(bf16, fp32)`` and ``Zero3(compute_dtype=bf16)``, 3 SGD steps each:
    the largest parameter gap between them, and FSDP2's from one process casting the same way."""
    reference = reference_model()
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    fsdp = build_on_meta(reference.state_dict() if rank == 0 else None, mp_policy=policy)
    ours = Zero3(copy.deepcopy(reference), torch.bfloat16)
    for model in (fsdp, ours):
        sgd_steps(model, rank, world_size, num_steps)
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    for step in range(num_steps):
        mixed_precision_step(reference, optimizer, *token_batch(step, world_size, device=rank_device()), torch.bfloat16)
    full = ours.gather_full_params()
    gap = max((p.full_tensor() - full[n]).abs().max().item() for n, p in fsdp.named_parameters())
    result = {"FSDP2 vs Zero3": gap, "FSDP2 vs one process": full_gap(fsdp, reference)}
    dist.barrier()
    return result


def accumulate(rank: int, world_size: int, micro: int = 2, num_steps: int = 2) -> dict:
    """FSDP2 (float32) with ``micro`` micro-batches per step, synchronised on the last only, against one
    process that accumulates the same micro-batches of every rank: the largest parameter gap."""
    reference = reference_model()
    fsdp = build_on_meta(reference.state_dict() if rank == 0 else None)
    sgd_steps(fsdp, rank, world_size, num_steps, micro=micro)
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    for step in range(num_steps):
        optimizer.zero_grad()
        for m in range(micro):  # the global batch of each micro-step: every rank's rows
            tokens, targets = token_batch(step * micro + m, world_size, device=rank_device())
            (nn.functional.cross_entropy(reference(tokens), targets) / micro).backward()
        optimizer.step()
    gap = full_gap(fsdp, reference)
    dist.barrier()
    return {"accumulated": gap}


def gradient_bytes(model: nn.Module) -> int:
    """Bytes of every gradient tensor this rank holds: each parameter's sharded ``.grad``, and the
    unsharded gradients FSDP2 keeps per parameter while sync is off (read from its own records, the
    private ``FSDPParam``s: only counted), each tensor once (by its first byte and size)."""
    grads = [p.grad for p in model.parameters()]
    for module in model.modules():
        group = module._get_fsdp_state()._fsdp_param_group if isinstance(module, FSDPModule) else None
        for fsdp_param in group.fsdp_params if group else []:
            unsharded = getattr(fsdp_param, "_unsharded_param", None)
            grads += [getattr(fsdp_param, "unsharded_accumulated_grad", None),  # torch <= 2.10's fp32 buffer
                      None if unsharded is None else unsharded.grad]
    seen, total = set(), 0
    for g in grads:
        g = g.to_local() if isinstance(g, DTensor) else g
        if g is not None and g.numel() and (g.data_ptr(), g.numel()) not in seen:  # views of one buffer: each
            seen.add((g.data_ptr(), g.numel()))
            total += g.numel() * g.element_size()
    return total


def accumulation_bytes(rank: int, world_size: int) -> dict:
    """Gradient bytes this rank holds after the first of 2 micro-batches (bf16 policy, ``reduce_dtype``
    float32), with sync off (accumulating) and on (reduce-scattered at once), and after the step's last."""
    reference = reference_model()
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    result = {}
    for sync in (False, True):
        model = build_on_meta(reference.state_dict() if rank == 0 else None, mp_policy=policy)
        for m in range(2):
            model.set_requires_gradient_sync(sync or m == 1)
            tokens, targets = token_batch(m, world_size, rank, device=rank_device())
            (nn.functional.cross_entropy(model(tokens).float(), targets) / 2).backward()
            result[f"sync {'on' if sync else 'off'}, micro-batch {m + 1}"] = gradient_bytes(model)
    dist.barrier()
    return result


def reshard_settings(rank: int, world_size: int, settings: tuple = (True, False)) -> dict:
    """FSDP2 (float32) for each ``reshard_after_forward`` in ``settings``, 2 SGD steps, against one
    process on the global batch: the largest parameter gap per setting."""
    reference = reference_model()
    gaps = {}
    for setting in settings:  # a fresh state dict each time: the load puts the DTensors it made into it
        model = build_on_meta(reference.state_dict() if rank == 0 else None, reshard_after_forward=setting)
        sgd_steps(model, rank, world_size, 2)
        single = reference_model()
        optimizer = torch.optim.SGD(single.parameters(), lr=0.1)
        for step in range(2):
            mixed_precision_step(single, optimizer, *token_batch(step, world_size, device=rank_device()), None)
        gaps[setting] = full_gap(model, single)
    dist.barrier()
    return gaps


def practice_report(rank: int, world_size: int, settings: tuple = (True, False)) -> dict:
    """Every check above in one launch: ``meta``, ``versus``, ``accumulate``, ``gradient bytes`` and ``reshard``
    (over ``settings``)."""
    return {"meta": meta_init(rank, world_size), "versus": versus_zero3(rank, world_size),
            "accumulate": accumulate(rank, world_size), "gradient bytes": accumulation_bytes(rank, world_size),
            "reshard": reshard_settings(rank, world_size, settings)}


def costs(rank: int, world_size: int, model_kwargs: dict | None = None, timing: bool = False) -> dict:
    """For ``bench sharding``: bytes this rank holds after one float32 Adam step with ``Zero3``
    (``"ZeRO-3"``, and ``"ZeRO-3 peak"``: plus the most it gathered at once, with as many bytes of
    full gradients) and with FSDP2 under the bf16 policy (``"FSDP2 bf16"``); with ``timing``, the
    median step seconds of ``Zero3`` and of ``fully_shard`` (float32, the same model), taking turns."""
    device, kwargs = rank_device(), model_kwargs or {}
    torch.manual_seed(0)
    reference = TinyTransformer(**kwargs).to(device)
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    models = {"ZeRO-3": Zero3(copy.deepcopy(reference)),
              "FSDP2 bf16": build_on_meta(reference.state_dict() if rank == 0 else None, mp_policy=policy,
                                          model_kwargs=kwargs),
              "FSDP2": build_on_meta(reference.state_dict() if rank == 0 else None, model_kwargs=kwargs)}
    optimizers = {k: torch.optim.Adam(m.parameters(), lr=1e-2) for k, m in models.items()}

    def step(name: str) -> None:
        tokens, targets = token_batch(0, world_size, rank, vocab=reference.vocab, device=device)
        optimizers[name].zero_grad()
        nn.functional.cross_entropy(models[name](tokens).float(), targets).backward()
        if isinstance(models[name], Zero3):
            models[name].finish_gradient_synchronization()
        optimizers[name].step()

    for name in models:
        step(name)
    result = {k: held(models[k].parameters(), optimizers[k]) for k in ("ZeRO-3", "FSDP2 bf16")}
    result["ZeRO-3 peak"] = result["ZeRO-3"].total + 2 * models["ZeRO-3"].peak_gathered_bytes
    if timing:
        times = take_turns({k: (lambda k=k: step(k)) for k in ("ZeRO-3", "FSDP2")}, steps=3, repeat=3, device=device)
        result["seconds"] = {k: v["median"] for k, v in times.items()}
    dist.barrier()
    return result


def main() -> None:
    with distributed() as (info, _):
        n = info.world_size
        report = practice_report(info.rank, n, (True, False) + ((2,) if n == 4 else ()))
        meta, versus, accumulated, reshard = (report[k] for k in ("meta", "versus", "accumulate", "reshard"))
        ok = (meta["equal"] and versus["FSDP2 vs Zero3"] <= 1e-3 and accumulated["accumulated"] <= 1e-6
              and all(g <= 1e-6 for g in reshard.values()))
        if info.is_main:
            print(f"meta init on {n} rank(s): {meta['local bytes']} of {meta['model bytes']} parameter bytes per rank")
            print(f"FSDP2 bf16 vs Zero3 bf16: {versus['FSDP2 vs Zero3']:.1e}; accumulation: "
                  f"{accumulated['accumulated']:.1e}; reshard_after_forward: "
                  + ", ".join(f"{k}: {v:.1e}" for k, v in reshard.items()))
        verdict(ok, f"FSDP2 in practice equals Zero3 and one process, {n} rank(s)", show=info.is_main)


if __name__ == "__main__":
    main()
