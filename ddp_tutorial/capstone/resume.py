"""Checkpoint under one layout, resume under another: ``torch.distributed.checkpoint`` (``22_capstone``).

A rank's state is its shards: parameters and Adam's moments as ``DTensor`` pieces (FSDP2 over
``dp``, TP over ``tp``) of its pipeline stage's blocks, named as in the whole model
(``layers.2.attention.wq.weight``: the stages keep the names). ``get_state_dict`` gives them under
those names; ``dcp.save`` writes every rank's pieces and, last, the metadata that says which
piece of which tensor is where, so a checkpoint without it was never finished. Under another
layout each rank asks ``dcp.load`` for the pieces its new shards cover, whatever ranks wrote them:
the resharding is DCP's, the training goes on as if never stopped.

    torchrun --nproc-per-node=4 -m ddp_tutorial.capstone.resume --save-layout dp=2,tp=2 --load-layout tp=2,pp=2
"""

from __future__ import annotations

import argparse
import tempfile

import torch.distributed as dist

from ddp_tutorial.capstone.composed import Parts, build, gather_weights, global_losses, train_steps
from ddp_tutorial.capstone.reference import GPTRun
from ddp_tutorial.sharding.sharded_checkpoint import quiet_dcp_writer

__all__ = ["save_worker", "resume_worker", "save_and_resume", "parse_layout", "main"]


def _state(parts: Parts) -> dict:
    """The model's and the optimizer's state under the whole model's names, as this rank's shards."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model, optim = get_state_dict(parts.model, parts.optimizer)
    return {"model": model, "optim": optim}


def save_worker(rank: int, world_size: int, layout: dict, path: str, steps: int = 2) -> list[float] | None:
    """Train steps ``0 .. steps-1`` on ``layout``, then save every rank's shards to ``path``; rank 0
    returns the global losses."""
    import torch.distributed.checkpoint as dcp

    parts = build(world_size, layout, GPTRun())
    losses = global_losses(parts, train_steps(parts, range(steps)))
    quiet_dcp_writer()  # torch 2.9's writer warns from every rank (lesson 18 says why)
    dcp.save(_state(parts), checkpoint_id=path)
    dist.barrier()
    return losses if rank == 0 else None


def resume_worker(rank: int, world_size: int, layout: dict, path: str, *, start: int = 2,
                  steps: int = 2) -> dict | None:
    """Load ``path`` into a fresh run on ``layout`` and train steps ``start .. start+steps-1``;
    rank 0 returns their global losses and the whole weights after them."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict

    parts = build(world_size, layout, GPTRun())
    state = _state(parts)  # the shapes and placements to fill: this layout's shards
    dcp.load(state, checkpoint_id=path)
    set_state_dict(parts.model, parts.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    losses = global_losses(parts, train_steps(parts, range(start, start + steps)))
    weights = gather_weights(parts.model, parts.mesh)
    dist.barrier()
    return {"losses": losses, "state": weights} if rank == 0 else None


def save_and_resume(rank: int, world_size: int, saved: dict, resumed: dict, path: str, *,
                    steps: int = 2) -> dict | None:
    """``save_worker`` on layout ``saved``, then ``resume_worker`` on layout ``resumed``, in one launch;
    rank 0 returns the losses before and after the checkpoint and the final whole weights."""
    before = save_worker(rank, world_size, saved, path, steps)
    after = resume_worker(rank, world_size, resumed, path, start=steps, steps=steps)
    dist.barrier()  # no rank removes or rewrites the checkpoint while another still reads it
    return {"losses": before + after["losses"], "state": after["state"]} if rank == 0 else None


def parse_layout(text: str) -> dict:
    """``"dp=2,tp=2"`` -> ``{"dp": 2, "tp": 2}``."""
    return {k: int(v) for k, v in (item.split("=") for item in text.split(",") if item)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--save-layout", type=parse_layout, default={"dp": 2, "tp": 2})
    parser.add_argument("--load-layout", type=parse_layout, default={"tp": 2, "pp": 2})
    parser.add_argument("--steps", type=int, default=2, help="steps before the checkpoint, and after it")
    args = parser.parse_args()
    from ddp_tutorial.capstone.composed import TOLERANCE, against_one_process
    from ddp_tutorial.env import distributed

    with distributed() as (info, _):
        with tempfile.TemporaryDirectory() as scratch:
            names = [scratch]
            dist.broadcast_object_list(names, src=0)  # one directory: rank 0's (one machine)
            result = save_and_resume(info.rank, info.world_size, args.save_layout, args.load_layout, names[0],
                                     steps=args.steps)
    if info.is_main:
        losses = [f"{x:.4f}" for x in result["losses"]]
        print("losses:", " ".join(losses[:args.steps]), "| resumed:", " ".join(losses[args.steps:]))
        against_one_process(result, 2 * args.steps, f"saved under {args.save_layout}, resumed under {args.load_layout}: "
                                        f"as if uninterrupted (within {TOLERANCE:g})")


if __name__ == "__main__":
    main()
