"""Who this process is: rank, local rank and world size from the launcher's environment.

torchrun (and ``launch.spawn``) set ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``; a module that
needs them, started without them, raises ``NotLaunchedError`` saying how to start it, instead
of a ``KeyError: 'RANK'`` (``09_torchrun``, ``12_debugging_and_pitfalls``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

import torch.distributed as dist

__all__ = ["NotLaunchedError", "RankInfo", "launched_by_torchrun", "launcher_variable", "rank_info", "local_rank"]


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

    For showing what a launcher did or did not set (12_debugging_and_pitfalls); code that needs
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
