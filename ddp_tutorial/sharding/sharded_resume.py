"""Crash, restart, resume from a sharded checkpoint to identical weights (``18_zero3_and_checkpoints``).

Lesson 11 resumes DDP from rank 0's ``torch.save`` file. With FSDP2 each rank saves its own
shards through DCP, and the training state is one ``Stateful`` object (``TrainingState``):
DCP calls its ``state_dict()`` when saving and its ``load_state_dict()`` after reading, so the
model, the optimizer, the step, and each rank's RNG state and data position travel together
(the last two under keys that carry the rank: DCP keeps one copy of a key all ranks share).

- ``dcp.save`` blocks until every rank has written; ``dcp.async_save`` returns once this rank's
  state is copied to CPU memory (staged), and the writing overlaps the next training steps. Its
  future must be done before the next save starts, and before the checkpoint counts; its
  collectives run in a background thread, on a process group of their own;
- a checkpoint counts only when complete: rank 0 then writes the ``latest`` marker atomically
  (a temporary file renamed over it), so a crash in the middle of a save leaves the previous one;
- on restart (torchrun ``--max-restarts``) every rank reads ``latest`` and loads that folder.

    torchrun --nproc-per-node=2 --max-restarts=1 -m ddp_tutorial.sharding.sharded_resume --checkpoint-dir ckpt --fail-at-step 3
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.stateful import Stateful

from ddp_tutorial.env import distributed, rank_device
from ddp_tutorial.models import TinyTransformer, token_batch
from ddp_tutorial.sharding.fsdp import shard_model
from ddp_tutorial.sharding.sharded_checkpoint import quiet_dcp_writer

__all__ = ["TrainingState", "next_batch", "train_with_checkpoints", "digest", "latest_step"]


class TrainingState(Stateful):
    """Model, optimizer, step, and this rank's RNG state and data position as one ``Stateful`` (one DCP key).

    The model's and the optimizer's values are DTensor shards: DCP knows which piece each rank
    holds. The RNG state and the data position are plain per-rank values: under one key for all
    ranks DCP would keep one copy (it deduplicates identical keys when it plans the save) and every
    rank would resume with rank 0's. So their keys carry the rank (torchtitan keys its data loader's
    state by data-parallel rank the same way); each rank loads back only its own.
    """

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer):
        self.model, self.optimizer, self.step, self.position = model, optimizer, 0, 0

    def state_dict(self) -> dict:
        model_state, optim_state = get_state_dict(self.model, self.optimizer)  # sharded, keyed by name
        rank = dist.get_rank()
        return {"model": model_state, "optim": optim_state, "step": self.step,
                f"rng.rank{rank}": torch.get_rng_state(), f"data.rank{rank}": torch.tensor(self.position)}

    def load_state_dict(self, state: dict) -> None:
        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        rank = dist.get_rank()
        self.step, self.position = state["step"], int(state[f"data.rank{rank}"])
        torch.set_rng_state(state[f"rng.rank{rank}"])


def next_batch(state: TrainingState, rank: int, world_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's batch at its data position, a random eighth of its input tokens masked (to token 0)
    with the rank's RNG: a stand-in for a shuffling loader and a random augmentation, both per rank."""
    tokens, targets = token_batch(state.position, world_size, rank, device=rank_device())
    state.position += 1
    keep = torch.rand(tokens.shape) >= 0.125  # draws from this rank's RNG: a resume must restore it
    return tokens * keep.to(tokens.device), targets


def latest_step(folder: str) -> int | None:
    """The step of the last complete checkpoint in ``folder`` (its ``latest`` marker), or None."""
    try:
        with open(os.path.join(folder, "latest")) as f:
            return int(f.read())
    except FileNotFoundError:
        return None


def mark_latest(folder: str, step: int) -> None:
    """Rank 0, once the checkpoint of ``step`` is complete: rename a temporary file over ``latest``."""
    if dist.get_rank() == 0:
        temporary = os.path.join(folder, "latest.tmp")
        with open(temporary, "w") as f:
            f.write(str(step))
        os.replace(temporary, os.path.join(folder, "latest"))  # atomic: the old marker or the new, never half


def digest(model: nn.Module) -> str:
    """A hash of every full parameter's bytes (a collective: every rank calls it): equal only if bitwise equal."""
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.full_tensor().detach().cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def train_with_checkpoints(rank: int, world_size: int, folder: str, steps: int, fail_at: int | None = None,
                           use_async: bool = False, attempt: int = 0, *, restore_rng: bool = True) -> dict:
    """FSDP2 + Adam for ``steps`` steps, a DCP checkpoint after each; resume from ``latest`` if there is one.
    ``fail_at``: the last rank dies at that step on attempt 0; ``restore_rng=False`` resumes with a freshly
    seeded RNG instead of the saved one (the mistake). Returns the step resumed from, the digest, and this
    rank's data position and RNG state's hash after the last step."""
    quiet_dcp_writer()  # the saves below, blocking and async
    torch.manual_seed(0)  # the same initial weights on every rank
    model = shard_model(TinyTransformer().to(rank_device()))
    state = TrainingState(model, torch.optim.Adam(model.parameters(), lr=1e-2))
    torch.manual_seed(1 + rank)  # each rank's own data RNG
    resumed = latest_step(folder)
    if resumed is not None:
        rng = torch.get_rng_state()
        dcp.load({"app": state}, checkpoint_id=os.path.join(folder, f"step-{resumed}"))  # calls load_state_dict
        if not restore_rng:
            torch.set_rng_state(rng)
    pending = None  # (future, step) of an async save in flight
    # The async save's collectives run in a background thread: on the training's group they would
    # interleave with FSDP2's all-gathers in a different order on each rank (a hang). A group of its own.
    save_group = dist.new_group(backend="gloo") if use_async else None
    for step in range(state.step, steps):
        if step == fail_at and attempt == 0 and rank == world_size - 1:
            print(f"rank {rank}: injected failure at step {step}", file=sys.stderr, flush=True)
            os._exit(1)  # like a killed process
        tokens, targets = next_batch(state, rank, world_size)
        state.optimizer.zero_grad()
        nn.functional.cross_entropy(model(tokens), targets).backward()
        state.optimizer.step()
        state.step = step + 1
        if pending is not None:  # one save at a time; the previous one counts once it is done
            pending[0].result()
            mark_latest(folder, pending[1])
        where = os.path.join(folder, f"step-{state.step}")
        if use_async:  # returns once staged: the writes overlap the next step
            pending = (dcp.async_save({"app": state}, checkpoint_id=where, process_group=save_group), state.step)
        else:
            dcp.save({"app": state}, checkpoint_id=where)
            mark_latest(folder, state.step)
    if pending is not None:
        pending[0].result()
        mark_latest(folder, pending[1])
    result = {"resumed from": resumed, "digest": digest(model), "position": state.position,
              "rng": hashlib.sha256(torch.get_rng_state().numpy().tobytes()).hexdigest()[:16]}
    dist.barrier()  # see fsdp.gradients_vs_ddp
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint-dir", required=True)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--fail-at-step", type=int, default=None)
    parser.add_argument("--async-save", action="store_true")
    args = parser.parse_args()
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    os.makedirs(args.checkpoint_dir, exist_ok=True)
    with distributed() as (info, _):
        result = train_with_checkpoints(info.rank, info.world_size, args.checkpoint_dir, args.steps,
                                        args.fail_at_step, args.async_save, attempt)
        if info.is_main:
            start = "the start" if result["resumed from"] is None else f"step {result['resumed from']}"
            print(f"attempt {attempt}: trained from {start} to step {args.steps}; weights {result['digest']}")


if __name__ == "__main__":
    main()
