"""Backend and device choice, rank information, and set-up/tear-down of a process group.

The rule used everywhere in the course (``00_start_here``, ``06_ddp_spawn``, ``train``):
NCCL and ``cuda:LOCAL_RANK`` only when CUDA has a device for every local rank,
otherwise gloo on the CPU. The pure functions take device counts as arguments so
the rule is unit-tested without a GPU. Inside a group, ``rank_device()`` is where a
rank's tensors must live: a CPU tensor through NCCL fails ("No backend type
associated with device type cpu"), so no lesson hard-codes the CPU.

Run a module that needs torchrun without it and you get ``NotLaunchedError``
saying how to start it, instead of a ``KeyError: 'RANK'``.
"""

from __future__ import annotations

import gc
import os
import re
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Iterator, Mapping, TextIO

import torch
import torch.distributed as dist

__all__ = ["cuda_device_count", "choose_backend", "serves_cuda", "choose_device", "set_device_for", "bound_device", "RankInfo",
           "NotLaunchedError", "rank_info", "local_rank", "rank_device", "launched_by_torchrun", "whole_lines",
           "distributed", "SlurmError", "tasks_per_node", "slurm_rank_info", "slurm_launcher_env"]


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


class NotLaunchedError(RuntimeError):
    """A module that needs torchrun's environment was started without torchrun."""


@dataclass(frozen=True)
class RankInfo:
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    restart_count: int = 0

    @property
    def node_rank(self) -> int:
        return self.rank // self.local_world_size

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def launched_by_torchrun(environ: Mapping[str, str] | None = None) -> bool:
    """torchrun (and our ``spawn``) set ``RANK``; a plain ``python`` run does not."""
    return "RANK" in (os.environ if environ is None else environ)


def launcher_variable(name: str, environ: Mapping[str, str] | None = None) -> str:
    """A launcher variable exactly as set (``LOCAL_RANK``, ``RANK``, ...), or ``"unset"``.

    For showing what a launcher did or did not set (11_debugging_and_pitfalls); code that needs
    the rank uses ``rank_info`` or ``local_rank``.
    """
    return (os.environ if environ is None else environ).get(name, "unset")


def rank_info(environ: Mapping[str, str] | None = None, *, module: str = "this module",
              allow_single: bool = True) -> RankInfo:
    """Read RANK, LOCAL_RANK, WORLD_SIZE (and torchrun's restart count) from the environment.

    Without torchrun: one process (rank 0 of 1) when ``allow_single``, otherwise
    ``NotLaunchedError`` with the command to use.
    """
    env = os.environ if environ is None else environ
    if not launched_by_torchrun(env):
        if allow_single:
            return RankInfo(0, 0, 1, 1)
        raise NotLaunchedError(
            f"{module} must be started by torchrun, which sets RANK, LOCAL_RANK and WORLD_SIZE; "
            f"for example: torchrun --nproc-per-node=2 -m {module}")
    try:
        rank, world_size = int(env["RANK"]), int(env["WORLD_SIZE"])
        local_rank = int(env.get("LOCAL_RANK", rank))
        local_world_size = int(env.get("LOCAL_WORLD_SIZE", world_size))
        restarts = int(env.get("TORCHELASTIC_RESTART_COUNT", 0))
    except KeyError as missing:
        raise NotLaunchedError(f"RANK is set but {missing.args[0]} is not: start with torchrun") from None
    except ValueError as bad:
        raise NotLaunchedError(f"malformed torchrun environment: {bad}") from None
    if world_size < 1 or not 0 <= rank < world_size:
        raise NotLaunchedError(f"RANK={rank} is not in range for WORLD_SIZE={world_size}")
    if not 0 <= local_rank < local_world_size:
        raise NotLaunchedError(f"LOCAL_RANK={local_rank} is not in range for LOCAL_WORLD_SIZE={local_world_size}")
    return RankInfo(rank, local_rank, world_size, local_world_size, restarts)


class SlurmError(NotLaunchedError):
    """``srun``'s variables are missing or do not add up: a one-line message naming the variable."""


def tasks_per_node(spec: str) -> list[int]:
    """Expand Slurm's compressed task counts: ``"2(x3),1"`` -> ``[2, 2, 2, 1]``.

    The format of ``SLURM_TASKS_PER_NODE`` (and of ``SLURM_NTASKS_PER_NODE`` when the counts
    differ between nodes): ``count`` or ``count(xrepeat)``, comma-separated, in node order.
    """
    counts = []
    for part in str(spec).replace(" ", "").split(","):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part)
        if match is None or int(match.group(1)) < 1 or (match.group(2) and int(match.group(2)) < 1):
            raise SlurmError(f"malformed task count {part!r} in {spec!r}: expected N or N(xM), "
                             f"comma-separated, like '2(x3),1'")
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts


def slurm_rank_info(environ: Mapping[str, str] | None = None) -> RankInfo:
    """Rank, local rank and world size of a task ``srun`` started, one task per rank, no torchrun.

    ``SLURM_PROCID`` is the rank, ``SLURM_LOCALID`` the local rank, ``SLURM_NTASKS`` the world
    size; the node's own count comes from the per-node list (``SLURM_STEP_TASKS_PER_NODE``,
    else ``SLURM_TASKS_PER_NODE``, else ``SLURM_NTASKS_PER_NODE``) at ``SLURM_NODEID``
    (``15_cluster``; ``python -m ddp_tutorial.slurm`` exports them the way torchrun would).
    """
    env = os.environ if environ is None else environ
    names = ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS", "SLURM_NODEID")
    missing = [name for name in names if name not in env]
    if missing:
        raise SlurmError(f"{', '.join(missing)} not set: start each rank with srun inside a Slurm job "
                         f"(srun python -m ddp_tutorial.slurm MODULE ...)")
    try:
        rank, local, world_size, node = (int(env[name]) for name in names)
    except ValueError:
        raise SlurmError("malformed Slurm environment: " + ", ".join(f"{n}={env[n]!r}" for n in names)) from None
    per_node_name = next((n for n in ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE")
                          if n in env), None)
    if per_node_name is None:
        raise SlurmError("SLURM_TASKS_PER_NODE not set: cannot tell how many ranks share this node")
    counts = tasks_per_node(env[per_node_name])
    if len(counts) == 1 and node > 0:  # --ntasks-per-node=N: one number for every node
        counts = counts * (node + 1)
    if not 0 <= node < len(counts):
        raise SlurmError(f"SLURM_NODEID={node} but {per_node_name}={env[per_node_name]!r} lists {len(counts)} node(s)")
    if per_node_name != "SLURM_NTASKS_PER_NODE" and sum(counts) != world_size:
        raise SlurmError(f"{per_node_name}={env[per_node_name]!r} adds up to {sum(counts)} tasks, "
                         f"but SLURM_NTASKS={world_size}")
    if world_size < 1 or not 0 <= rank < world_size:
        raise SlurmError(f"SLURM_PROCID={rank} is not in range for SLURM_NTASKS={world_size}")
    if not 0 <= local < counts[node]:
        raise SlurmError(f"SLURM_LOCALID={local} is not in range for {counts[node]} task(s) on node {node}")
    restarts = int(env.get("SLURM_RESTART_COUNT", 0) or 0)
    return RankInfo(rank, local, world_size, counts[node], restarts)


def slurm_launcher_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables torchrun would have set, from ``srun``'s (``slurm_rank_info``): RANK, LOCAL_RANK,
    WORLD_SIZE, LOCAL_WORLD_SIZE and GROUP_RANK (the node). MASTER_ADDR/MASTER_PORT come from the job script.
    """
    env = os.environ if environ is None else environ
    info = slurm_rank_info(env)
    return {"RANK": str(info.rank), "LOCAL_RANK": str(info.local_rank), "WORLD_SIZE": str(info.world_size),
            "LOCAL_WORLD_SIZE": str(info.local_world_size), "GROUP_RANK": str(int(env["SLURM_NODEID"]))}


def local_rank(environ: Mapping[str, str] | None = None) -> int:
    """This process's rank on its node: ``LOCAL_RANK`` (torchrun, ``launch.spawn``), else ``RANK``
    (as in ``rank_info``), else the rank in the initialised default group (the ``mp.spawn``
    recipes start every rank on one node), else 0.
    """
    env = os.environ if environ is None else environ
    for name in ("LOCAL_RANK", "RANK"):
        if name in env:
            try:
                return int(env[name])
            except ValueError:
                raise NotLaunchedError(f"malformed launcher environment: {name}={env[name]!r}") from None
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return 0


def rank_device(group: dist.ProcessGroup | None = None) -> torch.device:
    """Where this rank's tensors live for ``group``'s backend (default group): ``cuda:LOCAL_RANK``
    when it serves CUDA, else the CPU. Every lesson that puts tensors through a collective uses it
    (``03_point_to_point``, ``04_collectives``, ``06_ddp_spawn``, ...).
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
    (``09_model_parallel_ddp``), so it never opens a context on another's.
    """
    info = rank_info(environ)
    if dist.is_initialized():
        yield info, device or choose_device(local_rank(environ), dist.get_backend())
        return
    whole_lines()  # ranks share one stdout under torchrun: keep each printed line whole
    backend = backend or choose_backend(local_world_size=info.local_world_size)
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
        # 15_cluster's elastic demo): then rank 0 hosts it, as init_process_group would.
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
