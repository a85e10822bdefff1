"""Checkpoints that survive a crash: written by rank 0 atomically, sealed, read with ``weights_only``.

Used by ``train`` (``--checkpoint PATH --resume``), ``07_ddp_spawn``, ``09_torchrun`` (a run
killed and restarted by ``torchrun --max-restarts``) and ``11_train_end_to_end``.

- Only rank 0 writes: after DDP's all-reduce every rank holds the same weights,
  so one copy is enough, and two writers to one file would corrupt it.
- Atomic: the state goes to a temporary file of this process's own in the same directory,
  is flushed to disk, then ``os.replace``-d over the old checkpoint, and the directory is
  flushed too. A crash at any moment leaves either the old file or the new one, never half of one.
- Sealed: a SHA-256 of the file is stored in it (``checkpoint_file``), so a damaged file
  (cut short, one flipped bit) is refused in one line instead of resuming from changed weights.
- ``torch.load(..., weights_only=True)`` unpickles only tensors and plain
  containers, so a tampered file cannot run code; ``map_location`` puts the
  tensors on this rank's device (rank 0 saved them from its own).
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist

from ddp_tutorial.training.checkpoint_file import (
    CheckpointError,
    fsync_directory,
    make_folder,
    read_bytes,
    remove_stale,
    seal,
    temporary_name,
    unseal,
)

__all__ = ["CheckpointError", "save_checkpoint", "load_checkpoint", "agree_to_resume", "capture_rng", "restore_rng",
           "same_weights"]


def save_checkpoint(state: dict[str, Any], path: str) -> str:
    """Write ``state`` to ``path`` atomically (temporary file + ``os.replace``); return ``path``.

    Call it on rank 0 only. A file system error (a full disk, no permission) is a one-line
    ``CheckpointError``, and the previous checkpoint stays as it was.
    """
    data = seal(state)  # serialised first: a state that cannot be saved touches no file
    directory = make_folder(path)
    tmp = temporary_name(path)  # this process's own name: two runs on one path never touch each other's
    try:
        try:
            with open(tmp, "xb") as f:  # the usual mode (0666 less the umask), where mkstemp gives 0600
                f.write(data)
                f.flush()
                os.fsync(f.fileno())  # the bytes are on disk before the name points at them
            os.replace(tmp, path)
        except BaseException:  # an exception or SystemExit (SIGTERM): leave no partial file behind
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            raise
    except OSError as exc:
        raise CheckpointError(f"cannot write checkpoint {path}: {exc.strerror or exc} "
                              "(the previous checkpoint, if any, is intact)") from None
    fsync_directory(directory)  # the rename itself survives a power cut
    remove_stale(path)
    return path


def agree_to_resume(path: str | None) -> bool:
    """Whether to resume from ``path``: rank 0 decides and tells every rank (call it on all).

    If each rank asked ``os.path.exists`` itself, nodes without shared storage would
    disagree: some resume at epoch 5, some start at 0, and the first collective hangs.
    A rank that cannot see the file rank 0 resumes from fails at once, saying why.
    """
    found = bool(path) and os.path.exists(path)
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return found
    decision = [found]
    dist.broadcast_object_list(decision, src=0)
    if decision[0] and not found:
        raise CheckpointError(
            f"rank {dist.get_rank()} cannot see {path}, which rank 0 resumes from: checkpoints "
            "need storage that every node sees (a shared file system), or a copy on each node")
    return bool(decision[0])


def load_checkpoint(path: str, map_location: str | torch.device = "cpu",
                    expect: dict[str, Any] | None = None, *, require: Iterable[str] = ()) -> dict[str, Any]:
    """Read a checkpoint with ``weights_only=True``; ``expect`` maps keys to required values.

    Anything that cannot be read safely, whose checksum does not match, that lacks a key
    in ``require`` or does not match ``expect`` (say, a checkpoint of another model) is a
    one-line ``CheckpointError`` naming the file.
    """
    data = unseal(read_bytes(path), path)
    try:
        state = torch.load(io.BytesIO(data), map_location=map_location, weights_only=True)
    except Exception as exc:  # noqa: BLE001 - damaged bytes raise anything from zip, pickle or storage code
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(f"cannot load checkpoint {path}: {first}") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"{path} is not a training checkpoint (it holds a {type(state).__name__})")
    missing = [key for key in (*require, *(expect or {})) if key not in state]
    if missing:
        raise CheckpointError(f"checkpoint {path} has no {', '.join(map(repr, missing))}: it was not written "
                              "by this training program; delete it to start afresh")
    for key, wanted in (expect or {}).items():
        found = state.get(key)
        if found != wanted:
            raise CheckpointError(f"checkpoint {path} was saved with {key}={found!r}, "
                                  f"but this run uses {key}={wanted!r}")
    return state


def capture_rng() -> dict[str, Any]:
    """The random generators' states (CPU, and CUDA when present), for an exact resume."""
    state: dict[str, Any] = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"].cpu())
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]])


def same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], atol: float = 0.0) -> bool:
    """True when two state dicts have the same keys and tensors (bitwise when ``atol`` is 0)."""
    if a.keys() != b.keys():
        return False
    for key in a:
        x, y = a[key].detach().cpu(), b[key].detach().cpu()
        if x.shape != y.shape or x.dtype != y.dtype:
            return False
        if atol == 0.0 or not x.is_floating_point():
            if not torch.equal(x, y):
                return False
        elif not torch.allclose(x, y, rtol=0.0, atol=atol):
            return False
    return True
