"""Sharded checkpoints with ``torch.distributed.checkpoint`` (DCP) that load on another number of ranks (``18_zero3_and_checkpoints``).

Lesson 11's checkpoint is one file that rank 0 writes with ``torch.save``. With FSDP2 no rank
holds the whole model: its parameters and Adam's state are ``DTensor`` shards. DCP writes each
rank's shards in parallel into one folder (a ``.distcp`` file per rank, plus ``.metadata``
naming which piece of which tensor lies where) and reads them back on *any* number of ranks:
each rank reads the byte ranges its new shards need (resharding).

- ``get_model_state_dict`` / ``get_optimizer_state_dict``: state dicts keyed by the parameters'
  names (the optimizer's too, not by position), values sharded as the model is;
- ``dcp.save`` on N ranks, ``dcp.load`` in place into a state dict of the same keys on M ranks,
  then ``set_model_state_dict`` / ``set_optimizer_state_dict``;
- ``StateDictOptions(full_state_dict=True, cpu_offload=True)``: whole tensors on rank 0's CPU,
  for evaluation or export; ``dcp_to_torch_save`` turns a DCP folder into one ``torch.save`` file.

    torchrun --nproc-per-node=4 -m ddp_tutorial.sharding.sharded_checkpoint   # save on 4, load on 4
"""

from __future__ import annotations

import warnings

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.tensor import DTensor

from ddp_tutorial.env import distributed, rank_device
from ddp_tutorial.launch.verdict import verdict
from ddp_tutorial.models import TinyTransformer, token_batch
from ddp_tutorial.sharding.fsdp import shard_model

__all__ = ["train_and_save", "load_and_compare", "full_values", "export_single_file", "quiet_dcp_writer",
           "local_elements"]


def quiet_dcp_writer() -> None:
    """Silence the one warning DCP's file writer prints on some releases, in this process, for every later save.

    torch 2.9's ``FileSystemWriter`` calls ``tensor.storage()`` and so warns "TypedStorage is
    deprecated" from each rank: torch's own text, not ours, that would make a notebook's output differ
    between releases. Process-wide (not ``catch_warnings``): ``async_save`` writes in a background thread.
    """
    warnings.filterwarnings("ignore", message="TypedStorage is deprecated", category=UserWarning,
                            module=r"torch\.distributed\.checkpoint")


def local_elements(shape: torch.Size, rank: int, world_size: int) -> int:
    """Elements of ``rank``'s dim-0 shard of a ``shape`` tensor, as ``torch.chunk`` cuts it (FSDP2's ``Shard(0)``):
    ``ceil(rows / N)`` rows per rank, the last ones fewer or none when N does not divide the rows."""
    rows = -(-shape[0] // world_size)
    return max(0, min(rows, shape[0] - rank * rows)) * (shape.numel() // shape[0])


def full_values(state: dict) -> dict[str, torch.Tensor]:
    """A nested state dict flattened to ``"a.b.c" -> full CPU tensor`` (a DTensor's ``full_tensor()``:
    a collective, so every rank calls it)."""
    flat: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        if isinstance(value, dict):
            flat.update({f"{key}.{k}": v for k, v in full_values(value).items()})
        elif isinstance(value, torch.Tensor):
            flat[str(key)] = (value.full_tensor() if isinstance(value, DTensor) else value).detach().cpu().clone()
    return flat


def build(world_size: int, seed: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    """A ``TinyTransformer`` sharded with FSDP2 over the ranks, and Adam over its shards."""
    torch.manual_seed(seed)
    model = shard_model(TinyTransformer().to(rank_device()))
    return model, torch.optim.Adam(model.parameters(), lr=1e-2)


def train_and_save(rank: int, world_size: int, path: str, num_steps: int = 2) -> dict[str, torch.Tensor]:
    """Train FSDP2 + Adam for ``num_steps``, ``dcp.save`` model and optimizer to the folder ``path``;
    return the full values of what was saved (the reference a load must give back)."""
    model, optimizer = build(world_size, seed=0)
    for step in range(num_steps):
        tokens, targets = token_batch(step, world_size, rank, device=rank_device())
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(tokens), targets).backward()
        optimizer.step()
    state = {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, optimizer)}
    quiet_dcp_writer()
    dcp.save(state, checkpoint_id=path)  # every rank writes its own shards, in parallel
    values = full_values(state)
    dist.barrier()  # see fsdp.gradients_vs_ddp: gloo and FSDP2's last collectives at exit
    return values


def load_and_compare(rank: int, world_size: int, path: str, saved: dict[str, torch.Tensor]) -> dict:
    """Build the model from another seed on ``world_size`` ranks, ``dcp.load`` the folder into it (any
    number of ranks saved it), and compare every full value with ``saved``: the keys, the largest
    difference, and the full-state-dict path's (rank 0 holds whole CPU tensors, the others nothing)."""
    model, optimizer = build(world_size, seed=1)
    # get_optimizer_state_dict gives a fresh Adam its state's shape (zeros), so there is something to load into
    state = {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, optimizer)}
    dcp.load(state, checkpoint_id=path)  # in place: each rank reads the byte ranges of its new shards
    set_model_state_dict(model, state["model"])
    set_optimizer_state_dict(model, optimizer, state["optim"])
    state = {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, optimizer)}
    loaded = full_values(state)
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    whole = get_model_state_dict(model, options=options)
    local_numel = sum(p.to_local().numel() for p in model.parameters())
    dist.barrier()
    return {"same keys": sorted(loaded) == sorted(saved),
            "difference": max((loaded[k] - saved[k]).abs().max().item() for k in saved if k in loaded),
            "full on this rank": len(whole),
            "full difference": max(((v - saved[f"model.{k}"]).abs().max().item() for k, v in whole.items()),
                                   default=0.0),
            "local elements": local_numel}


def export_single_file(dcp_path: str, file_path: str) -> dict[str, torch.Tensor]:
    """One process, no group: the DCP folder as one ``torch.save`` file, read back with ``weights_only=True``."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    dcp_to_torch_save(dcp_path, file_path)
    return full_values(torch.load(file_path, weights_only=True))


def main() -> None:
    import tempfile

    with distributed() as (info, _):
        folder = [tempfile.mkdtemp(prefix="dcp-") if info.is_main else None]
        dist.broadcast_object_list(folder)  # one folder for all (on several nodes: a shared file system)
        saved = train_and_save(info.rank, info.world_size, folder[0])
        result = load_and_compare(info.rank, info.world_size, folder[0], saved)
        ok = result["same keys"] and result["difference"] == 0 and result["full difference"] == 0
        if info.is_main:
            print(f"DCP save and load on {info.world_size} rank(s): {len(saved)} tensors, largest difference "
                  f"{result['difference']:.1e}")
        verdict(ok, f"a sharded checkpoint loads back exactly, {info.world_size} rank(s)", show=info.is_main)


if __name__ == "__main__":
    main()
