"""The one home of rank, local rank, world size, backend and device, and of a process group's set-up.

- ``devices``: the backend and device rule, as pure functions of device counts: NCCL and
  ``cuda:LOCAL_RANK`` only when CUDA has a device for every local rank, otherwise gloo on the
  CPU (``00_start_here``, ``07_ddp_spawn``, ``train``);
- ``ranks``: torchrun's variables; a module that needs them, started without them, raises
  ``NotLaunchedError`` saying how to start it, instead of a ``KeyError: 'RANK'``;
- ``slurm``: srun's variables mapped to the same (``16_cluster``).

This module re-exports them and holds what needs a live group: ``rank_device()`` is where a
rank's tensors must live (a CPU tensor through NCCL fails, "No backend type associated with
device type cpu", so no lesson hard-codes the CPU), and ``distributed()`` joins and leaves one.
"""

from __future__ import annotations

import gc
import os
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import timedelta
from typing import TextIO

import torch
import torch.distributed as dist

from ddp_tutorial.env.devices import (
    bound_device,
    choose_backend,
    choose_device,
    cuda_device_count,
    gloo_beside_gpus,
    one_gpu_per_task,
    serves_cuda,
    set_device_for,
)
from ddp_tutorial.env.ranks import (
    NotLaunchedError,
    RankInfo,
    launched_by_torchrun,
    launcher_variable,
    local_rank,
    rank_info,
)
from ddp_tutorial.env.slurm import SlurmError, slurm_launcher_env, slurm_rank_info, tasks_per_node

__all__ = ["cuda_device_count", "one_gpu_per_task", "gloo_beside_gpus", "choose_backend", "serves_cuda", "choose_device", "set_device_for", "bound_device", "RankInfo",
           "NotLaunchedError", "rank_info", "local_rank", "rank_device", "launched_by_torchrun", "launcher_variable",
           "whole_lines", "distributed", "SlurmError", "tasks_per_node", "slurm_rank_info", "slurm_launcher_env"]


def rank_device(group: dist.ProcessGroup | None = None) -> torch.device:
    """Where this rank's tensors live for ``group``'s backend (default group): ``cuda:LOCAL_RANK``
    when it serves CUDA, else the CPU. Every lesson that puts tensors through a collective uses it
    (``04_point_to_point``, ``05_collectives``, ``07_ddp_spawn``, ...).
    """
    backend = dist.get_backend(group)
    if backend == "undefined":  # a group made without a backend (torch 2.6+): "cuda:nccl", "cpu:gloo"
        backend = str(dist.get_backend_config(group))
    return choose_device(local_rank(), backend)


def whole_lines(*streams: TextIO) -> None:
    """Make every ``print`` reach the OS as one write, so ranks sharing a pipe never split a line.

    Under torchrun all ranks write to one stdout. Unbuffered Python (``-u``,
    ``PYTHONUNBUFFERED``) writes a line's text and its newline separately, and
    another rank's output can land in between. Defaults to stdout and stderr.
    """
    for stream in streams or (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)  # a notebook's streams have none
        if reconfigure is not None:
            reconfigure(line_buffering=True, write_through=False)


@contextmanager
def distributed(backend: str | None = None, *, timeout: float = 300.0,
                environ: Mapping[str, str] | None = None,
                device: torch.device | None = None) -> Iterator[tuple[RankInfo, torch.device]]:
    """Join the default process group from torchrun's environment; always leave it.

    Yields ``(info, device)``. A single process (no torchrun) gets a world of
    one, so the same script runs alone and under torchrun. If the group was
    already initialised (by ``launch.spawn``), it is used and left alone.
    ``device`` (default: ``choose_device``) becomes the current CUDA device
    before the group exists: a model-parallel rank passes its first own GPU
    (``10_model_parallel_ddp``), so it never opens a context on another's.
    """
    info = rank_info(environ)
    if dist.is_initialized():
        yield info, device or choose_device(local_rank(environ), dist.get_backend())
        return
    whole_lines()  # ranks share one stdout under torchrun: keep each printed line whole
    if backend is None:
        backend = choose_backend(local_world_size=info.local_world_size)
        note = gloo_beside_gpus(backend, cuda_device_count(), info.local_world_size,
                                nccl_available=dist.is_nccl_available())
        if note and info.local_rank == 0:  # once per node: CPUs training beside idle GPUs
            print(note, file=sys.stderr, flush=True)
    if device is None:
        device = set_device_for(info.local_rank, backend)
    elif device.type == "cuda":
        torch.cuda.set_device(device)  # before NCCL or anything else touches CUDA
    limit = timedelta(seconds=timeout)
    if not launched_by_torchrun(environ):
        # One process: a world of one on an in-memory store, no port needed.
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1,
                                device_id=bound_device(device))
    elif info.restart_count > 0:
        # torchrun keeps one store for the whole job. After a restart, ranks could
        # read the addresses the dead ranks published and fail to connect, so each
        # attempt gets keys of its own.
        env = os.environ if environ is None else environ
        # The agent hosts that store, unless told not to share it (TORCH_DISABLE_SHARE_RDZV_TCP_STORE,
        # 16_cluster's elastic demo): then rank 0 hosts it, as init_process_group would.
        own_store = env.get("TORCHELASTIC_USE_AGENT_STORE", "True") == "False" and info.rank == 0
        store = dist.TCPStore(env["MASTER_ADDR"], int(env["MASTER_PORT"]), is_master=own_store, timeout=limit)
        dist.init_process_group(backend, store=dist.PrefixStore(f"attempt_{info.restart_count}/", store),
                                rank=info.rank, world_size=info.world_size, timeout=limit,
                                device_id=bound_device(device))
    else:
        dist.init_process_group(backend, timeout=limit, device_id=bound_device(device))
    try:
        yield info, device
    finally:
        # DDP's reducer and pending gloo work sit in reference cycles; freed later, at
        # interpreter shutdown, they can abort the process ("terminate called without
        # an active exception"). Free them while the group is still alive.
        gc.collect()
        dist.destroy_process_group()
