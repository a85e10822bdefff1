"""Spawn targets for tests/training/test_train.py (spawned functions must live in an importable module)."""

from __future__ import annotations

import os
import time

import torch.distributed as dist


def cifar10_download(rank: int, world_size: int, data_dir: str, fail: bool) -> tuple:
    """Call ``data.cifar10(data_dir, download=True)`` with torchvision's CIFAR10 replaced by a stub.

    The stub records ``(rank, download, rank 0's download finished)`` for every call.
    With ``fail`` a download raises ``OSError("offline")``; otherwise it takes a
    moment and then leaves a marker file, so a rank that did not wait for it would
    record ``False``. Returns the ``DataError`` message (or ``None``) and the calls.
    """
    from torchvision import datasets

    from ddp_tutorial.training import data

    calls = []
    marker = os.path.join(data_dir, "downloaded-by-rank0")

    class Stub:
        def __init__(self, root, train=True, transform=None, download=False):
            calls.append((rank, download, os.path.exists(marker)))
            if download:
                if fail:
                    raise OSError("offline")
                if not train:  # the last of the two downloads
                    time.sleep(0.5)  # slow enough for a rank that does not wait to overtake it
                    open(marker, "w").close()

    original = datasets.CIFAR10
    datasets.CIFAR10 = Stub
    try:
        dist.barrier()  # both ranks reach cifar10() together
        try:
            data.cifar10(data_dir, download=True)
        except data.DataError as exc:
            return str(exc), calls
        return None, calls
    finally:
        datasets.CIFAR10 = original


def resume_without_shared_storage(rank: int, world_size: int, folder: str, on_rank: int) -> object:
    """Each rank looks in its own "node-local" folder; only ``on_rank`` has a checkpoint there."""
    from ddp_tutorial.training.checkpoint import CheckpointError, agree_to_resume

    path = os.path.join(folder, f"node{rank}", "run.pt")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if rank == on_rank:
        open(path, "wb").close()
    try:
        return agree_to_resume(path)
    except CheckpointError as exc:
        return str(exc)
