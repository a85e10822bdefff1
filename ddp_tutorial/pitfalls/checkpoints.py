"""Checkpoint pitfalls, reproduced for real: every rank writing one file, loading without ``map_location``.

Used by ``12_debugging_and_pitfalls`` (through ``harness.outcome``). The right
way is ``ddp_tutorial.training.checkpoint.save_checkpoint`` (rank 0, atomic) and
``torch.load(..., map_location=device, weights_only=True)``; these workers show
what goes wrong without it. A write that pauses half way (``PausingWriter``)
makes the unlucky moment happen every time instead of once a month.

    python -m ddp_tutorial.pitfalls checkpoints     # the four demos
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable

import torch
import torch.distributed as dist

from ddp_tutorial.env import distributed

__all__ = ["PausingWriter", "every_rank_saves", "rank0_saves_atomically", "load_gpu_checkpoint",
           "unmapped_load_lands_on"]


class PausingWriter:
    """A binary file that calls ``pause()`` once, after the first write: a save caught half way."""

    def __init__(self, path: str, pause: Callable[[], None]):
        self._file = open(path, "wb")  # "wb" truncates at once, as torch.save(obj, path) does
        self._pause = pause

    def write(self, data: bytes) -> int:
        written = self._file.write(data)
        if self._pause is not None:
            self._file.flush()  # what is written so far is what another rank can read
            pause, self._pause = self._pause, None
            pause()
        return written

    def flush(self) -> None:
        self._file.flush()

    def fsync(self) -> None:
        """Flush, and have the OS put the bytes on disk: before a rename makes the file the checkpoint."""
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        self._file.close()


def _state(version: int) -> dict:
    torch.manual_seed(version)
    return {"version": version, "weight": torch.randn(64, 64)}


def _try_load(path: str) -> str:
    try:
        return f"loaded version {torch.load(path, weights_only=True)['version']}"
    except Exception as exc:  # a torn file raises from deep inside the zip reader
        return f"{type(exc).__name__}: {str(exc).splitlines()[0].split('. ')[0]}"


def every_rank_saves(rank: int, world_size: int, path: str) -> str:
    """Bug: every rank saves to ``path``. Rank 0 finished its save and reads the file back
    while the last rank's save has truncated it and is half way through."""
    writer_rank = world_size - 1
    with distributed(timeout=30.0):
        if rank == 0:
            torch.save(_state(1), path)
        dist.barrier()
        seen = ""
        if rank == writer_rank:
            def pause() -> None:
                dist.barrier()  # 1: half written; rank 0 reads now
                dist.barrier()  # 2: rank 0 has read

            f = PausingWriter(path, pause)
            torch.save(_state(1), f)
            f.close()
        else:
            dist.barrier()  # 1
            if rank == 0:
                seen = _try_load(path)
            dist.barrier()  # 2
        dist.barrier()
        return seen or _try_load(path)


def rank0_saves_atomically(rank: int, world_size: int, path: str) -> str:
    """Fix: only rank 0 writes, into a temporary file that ``os.replace`` puts in place.

    While rank 0 is half way through version 2, the others still read a
    complete version 1; after the barrier everybody reads version 2.
    """
    with distributed(timeout=30.0):
        if rank == 0:
            torch.save(_state(1), path)
        dist.barrier()
        seen_during = ""
        if rank == 0:
            def pause() -> None:
                dist.barrier()  # 1: half written; the others read now
                dist.barrier()  # 2: they have read

            fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), suffix=".tmp")
            os.close(fd)
            f = PausingWriter(tmp, pause)
            torch.save(_state(2), f)
            f.fsync()
            f.close()
            os.replace(tmp, path)  # atomic: readers see the old file or the new one, never half
        else:
            dist.barrier()  # 1
            seen_during = _try_load(path)
            dist.barrier()  # 2
        dist.barrier()  # rank 0 has replaced the file: read only after this
        after = _try_load(path)
        return f"during the save: {seen_during or '(writing)'}; after the barrier: {after}"


def unmapped_load_lands_on(cuda_devices: int) -> str:
    """Where a checkpoint saved from ``cuda:0`` loads without ``map_location``: ``"cuda:0"`` on every
    rank when this machine has CUDA, else ``"error"`` (torch cannot restore onto a missing GPU)."""
    return "cuda:0" if cuda_devices > 0 else "error"


def load_gpu_checkpoint(rank: int, world_size: int, path: str, use_map_location: bool) -> str:
    """Rank 0 saves a checkpoint from its GPU (``cuda:0``); every rank loads it.

    Without ``map_location`` the tensors go back to ``cuda:0`` on every rank (on
    GPUs: all ranks fill GPU 0) or fail on a machine without CUDA
    (``unmapped_load_lands_on``). With ``map_location=device`` each rank gets
    them on its own device. Returns where they landed and whether that is the
    rank's own device (``cpu`` with gloo, ``cuda:LOCAL_RANK`` with NCCL).
    """
    with distributed(timeout=30.0) as (_, device):
        if rank == 0:
            if device.type == "cuda":
                state = {"weight": torch.ones(3, device=device)}
            else:
                # A CPU rank: tag the CPU tensor's storage "cuda:0", which is exactly
                # what a file written on GPU 0 records (torch's own location tags).
                torch.serialization.register_package(0, lambda storage: "cuda:0",
                                                     lambda storage, location: None)
                state = {"weight": torch.ones(3)}
            tmp = path + ".tmp"
            torch.save(state, tmp)
            os.replace(tmp, path)
        dist.barrier()
        kwargs = {"map_location": device} if use_map_location else {}
        try:
            weight = torch.load(path, weights_only=True, **kwargs)["weight"]
        except RuntimeError as exc:
            return f"RuntimeError: {str(exc).split('. ')[0]}"
        mine = "its own device" if weight.device == device else f"not its own device ({device})"
        return f"loaded on {weight.device}: {mine}"
