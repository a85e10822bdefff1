"""Backend and device choice as pure functions of device counts (the rule of ``ddp_tutorial.env``).

NCCL and ``cuda:LOCAL_RANK`` when CUDA has a device for every local rank, otherwise gloo
on the CPU (``00_start_here``, ``02_process_groups``, ``07_ddp_spawn``). One exception: a rank
that srun started as its own task under per-task GPU binding (``--gpus-per-task=1``,
``--gpu-bind``) sees exactly one GPU, its own, so it takes NCCL on ``cuda:0`` (``16_cluster``).
When CUDA is there but the rule still picks gloo, ``gloo_beside_gpus`` is the one line that
says so, printed by ``env.distributed`` (the entry of every job: torchrun, srun) on stderr: a
job that trains on CPUs beside idle GPUs is a mistake nobody notices otherwise. (Notebook ranks
are not warned: a lesson on a one-GPU laptop runs its two ranks on gloo on purpose.) The counts are
arguments, so the rule is unit-tested without a GPU (tests/infra/test_env.py).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import torch
import torch.distributed as dist

__all__ = ["cuda_device_count", "one_gpu_per_task", "choose_backend", "gloo_beside_gpus", "serves_cuda",
           "choose_device", "set_device_for", "bound_device"]


def cuda_device_count() -> int:
    """The CUDA devices this process sees (0 without CUDA); it opens no context on any of them."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def one_gpu_per_task(environ: Mapping[str, str] | None = None) -> bool:
    """True when srun started this rank as a task of its own (no torchrun in between).

    Under per-task GPU binding such a task sees only its GPU(s); a torchrun worker shares
    its node's visible GPUs with the other workers, so it never counts as bound.
    """
    environ = os.environ if environ is None else environ
    return "SLURM_LOCALID" in environ and "TORCHELASTIC_RUN_ID" not in environ


def choose_backend(cuda_devices: int | None = None, local_world_size: int = 1,
                   nccl_available: bool | None = None, *, bound_per_task: bool | None = None) -> str:
    """``"nccl"`` when there is a CUDA device for each of ``local_world_size`` local ranks, else ``"gloo"``.

    ``bound_per_task`` (default: ``one_gpu_per_task()``): each rank sees one GPU of its own, so one
    visible GPU is enough.
    """
    if cuda_devices is None:
        cuda_devices = cuda_device_count()
    if nccl_available is None:
        nccl_available = dist.is_available() and dist.is_nccl_available()
    if bound_per_task is None:
        bound_per_task = one_gpu_per_task()
    if local_world_size < 1:
        raise ValueError(f"local_world_size must be >= 1, got {local_world_size}")
    enough = cuda_devices >= local_world_size or (bound_per_task and cuda_devices == 1)
    return "nccl" if nccl_available and enough else "gloo"


def gloo_beside_gpus(backend: str, cuda_devices: int, local_world_size: int, *, nccl_available: bool = True) -> str | None:
    """The one-line warning when ``backend`` is gloo although CUDA has devices, else None."""
    if backend != "gloo" or cuda_devices < 1:
        return None
    why = ("this torch has no NCCL" if not nccl_available else
           f"{local_world_size} local ranks share {cuda_devices} visible GPU(s): start at most "
           f"{cuda_devices} per node, or bind one GPU to each srun task (--gpus-per-task=1)")
    return f"ddp_tutorial.env: training on the CPU with gloo although CUDA is here ({why})"


def serves_cuda(backend: str) -> bool:
    """True for ``"nccl"`` and for a device map with a CUDA entry (``"cpu:gloo,cuda:nccl"``).

    gloo alone is the CPU's backend here: the course never sends CUDA tensors through it.
    """
    backend = str(backend).lower()
    if ":" not in backend:
        return backend == "nccl"
    return any(pair.split(":")[0].strip() == "cuda" for pair in backend.split(","))


def choose_device(local_rank: int, backend: str, cuda_devices: int | None = None, *,
                  bound_per_task: bool | None = None) -> torch.device:
    """The device a rank computes on: ``cuda:local_rank`` when the backend serves CUDA, else the CPU.

    A task bound to one GPU (``one_gpu_per_task``, one visible device) computes on ``cuda:0``, its own.
    """
    if not serves_cuda(backend):
        return torch.device("cpu")
    if cuda_devices is None:
        cuda_devices = cuda_device_count()
    if bound_per_task is None:
        bound_per_task = one_gpu_per_task()
    if bound_per_task and cuda_devices == 1:
        return torch.device("cuda", 0)
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
