"""Checkpoints that survive a crash: written by rank 0 atomically, read with ``weights_only``.

Used by ``train`` (``--checkpoint PATH --resume``), ``09_torchrun`` (a run
killed and restarted by ``torchrun --max-restarts``) and ``11_train_end_to_end``.

- Only rank 0 writes: after DDP's all-reduce every rank holds the same weights,
  so one copy is enough, and two writers to one file would corrupt it.
- Atomic: the state goes to a temporary file in the same directory, is flushed
  to disk, then ``os.replace``-d over the old checkpoint. A crash at any moment
  leaves either the old file or the new one, never half of one.
- ``torch.load(..., weights_only=True)`` unpickles only tensors and plain
  containers, so a tampered file cannot run code; ``map_location`` puts the
  tensors on this rank's device (rank 0 saved them from its own).
"""

from __future__ import annotations

import os
import pickle
import tempfile
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["CheckpointError", "save_checkpoint", "load_checkpoint", "agree_to_resume", "capture_rng", "restore_rng",
           "same_weights"]


class CheckpointError(ValueError):
    """An unreadable checkpoint, or one from another model: a one-line message."""


def save_checkpoint(state: dict[str, Any], path: str) -> str:
    """Write ``state`` to ``path`` atomically (temporary file + ``os.replace``); return ``path``.

    Call it on rank 0 only.
    """
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=os.path.basename(path) + ".", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())  # the bytes are on disk before the name points at them
        os.replace(tmp, path)
    except BaseException:  # an exception or SystemExit (SIGTERM): leave no partial file behind
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    _remove_stale(path, keep=tmp)
    return path


def _remove_stale(path: str, keep: str) -> None:
    """Temporary files of writers that were SIGKILLed mid-write (only rank 0 writes, so none is live)."""
    directory, name = os.path.split(os.path.abspath(path))
    for entry in os.listdir(directory):
        if entry.startswith(name + ".") and entry.endswith(".tmp") and entry != os.path.basename(keep):
            try:
                os.unlink(os.path.join(directory, entry))
            except FileNotFoundError:
                pass


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
                    expect: dict[str, Any] | None = None) -> dict[str, Any]:
    """Read a checkpoint with ``weights_only=True``; ``expect`` maps keys to required values.

    Anything that cannot be read safely, or does not match ``expect`` (say, a
    checkpoint of another model), is a ``CheckpointError``.
    """
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except FileNotFoundError:
        raise CheckpointError(f"no checkpoint at {path}") from None
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(f"cannot load checkpoint {path}: {first}") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"{path} is not a training checkpoint (it holds a {type(state).__name__})")
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
