"""Backend and device choice as pure functions of device counts (the rule of ``ddp_tutorial.env``).

NCCL and ``cuda:LOCAL_RANK`` only when CUDA has a device for every local rank, otherwise gloo
on the CPU (``00_start_here``, ``02_process_groups``, ``06_ddp_spawn``). The counts are
arguments, so the rule is unit-tested without a GPU (tests/infra/test_env.py).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

__all__ = ["cuda_device_count", "choose_backend", "serves_cuda", "choose_device", "set_device_for", "bound_device"]


def cuda_device_count() -> int:
    """The CUDA devices this process sees (0 without CUDA); it opens no context on any of them."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def choose_backend(cuda_devices: int | None = None, local_world_size: int = 1,
                   nccl_available: bool | None = None) -> str:
    """``"nccl"`` when there is a CUDA device for each of ``local_world_size`` local ranks, else ``"gloo"``."""
    if cuda_devices is None:
        cuda_devices = cuda_device_count()
    if nccl_available is None:
        nccl_available = dist.is_available() and dist.is_nccl_available()
    if local_world_size < 1:
        raise ValueError(f"local_world_size must be >= 1, got {local_world_size}")
    return "nccl" if nccl_available and cuda_devices >= local_world_size else "gloo"


def serves_cuda(backend: str) -> bool:
    """True for ``"nccl"`` and for a device map with a CUDA entry (``"cpu:gloo,cuda:nccl"``).

    gloo alone is the CPU's backend here: the course never sends CUDA tensors through it.
    """
    backend = str(backend).lower()
    if ":" not in backend:
        return backend == "nccl"
    return any(pair.split(":")[0].strip() == "cuda" for pair in backend.split(","))


def choose_device(local_rank: int, backend: str, cuda_devices: int | None = None) -> torch.device:
    """The device a rank computes on: ``cuda:local_rank`` when the backend serves CUDA, else the CPU."""
    if not serves_cuda(backend):
        return torch.device("cpu")
    if cuda_devices is None:
        cuda_devices = cuda_device_count()
    if not 0 <= local_rank < cuda_devices:
        raise ValueError(f"local_rank {local_rank} has no GPU: this node has {cuda_devices} "
                         f"CUDA device(s); start at most {cuda_devices} processes per node")
    return torch.device("cuda", local_rank)


def set_device_for(local_rank: int, backend: str) -> torch.device:
    """Choose the rank's device and make it current (NCCL needs the current device set)."""
    device = choose_device(local_rank, backend)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return device


def bound_device(device: torch.device) -> torch.device | None:
    """``init_process_group(device_id=...)`` for a rank computing on ``device``: its GPU, else None.

    Bound to its GPU, an NCCL group knows the device up front: ``barrier()`` need not
    guess it (and warn), and no rank touches another's GPU.
    """
    return device if device.type == "cuda" else None
