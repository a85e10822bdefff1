"""Rank, local rank and world size of a task that ``srun`` started, from Slurm's variables.

``SLURM_PROCID`` -> rank, ``SLURM_LOCALID`` -> local rank, ``SLURM_NTASKS`` -> world size, the
node's share from ``SLURM_TASKS_PER_NODE`` (``16_cluster``; ``python -m ddp_tutorial.cluster.jobs``
turns them into torchrun's variables). Pure functions of an environment mapping, unit-tested
in tests/cluster/test_jobs.py.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from ddp_tutorial.env.ranks import NotLaunchedError, RankInfo

__all__ = ["SlurmError", "tasks_per_node", "slurm_rank_info", "slurm_launcher_env"]


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
    (``16_cluster``; ``python -m ddp_tutorial.cluster.jobs`` exports them the way torchrun would).
    """
    env = os.environ if environ is None else environ
    names = ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS", "SLURM_NODEID")
    missing = [name for name in names if name not in env]
    if missing:
        raise SlurmError(f"{', '.join(missing)} not set: start each rank with srun inside a Slurm job "
                         f"(srun python -m ddp_tutorial.cluster.jobs MODULE ...)")
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
