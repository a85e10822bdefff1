"""Slurm: the course's job scripts, and one ``srun`` task per rank without torchrun (``16_cluster``).

The scripts live next to this module, in ``ddp_tutorial/cluster/``; ``make slurm-test``
submits exactly these files to a throwaway two-node Slurm, so what the lesson shows is
what CI ran. From a shell:

    python -m ddp_tutorial.cluster.jobs list                          # the scripts and what each does
    python -m ddp_tutorial.cluster.jobs show multi_node.sbatch        # print one (copy it, then sbatch it)
    sbatch $(python -m ddp_tutorial.cluster.jobs path multi_node.sbatch) --epochs 5
    srun python -m ddp_tutorial.cluster.jobs ddp_tutorial.training.train ...   # inside a job: this task is one rank

The last form maps ``srun``'s variables (``SLURM_PROCID``, ``SLURM_LOCALID``,
``SLURM_NTASKS``, the tasks per node) to the ones torchrun sets (``env.slurm_launcher_env``)
and then runs the module as ``python -m`` would, in this process. ``MASTER_ADDR`` and
``MASTER_PORT`` come from the job script: only it knows which node is first.
"""

from __future__ import annotations

import os
import runpy
import sys
from collections.abc import Mapping, MutableMapping

from ddp_tutorial.env import SlurmError, slurm_launcher_env

__all__ = ["SCRIPTS", "script_path", "script_text", "export_rank_env", "run_module", "main"]

CLUSTER_DIR = os.path.dirname(os.path.abspath(__file__))  # the job scripts live beside this module

# name -> what it shows; the order is the lesson's
SCRIPTS = {
    "single_node.sbatch": "one node: one srun task runs torchrun on 127.0.0.1 with a process per GPU (or CPU)",
    "multi_node.sbatch": "several nodes: one torchrun per node, c10d rendezvous at the first node",
    "srun_ranks.sbatch": "no torchrun: srun starts one task per rank, ddp_tutorial.cluster.jobs maps its variables",
    "requeue.sbatch": "preemption: --signal warns, the training checkpoints and stops, the job requeues itself",
}


def script_path(name: str) -> str:
    """The path of one of the course's job scripts (``SCRIPTS``)."""
    if name not in SCRIPTS:
        raise ValueError(f"no job script {name!r}; the course has: {', '.join(SCRIPTS)}")
    return os.path.join(CLUSTER_DIR, name)


def script_text(name: str) -> str:
    """A job script's text, as the lesson shows it and ``make slurm-test`` submits it."""
    with open(script_path(name), encoding="utf-8") as f:
        return f.read()


def export_rank_env(environ: MutableMapping[str, str], slurm: Mapping[str, str] | None = None) -> dict[str, str]:
    """Set RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK in ``environ`` from ``slurm``'s
    variables (default: ``environ`` itself); return what was set. Needs MASTER_ADDR and MASTER_PORT.
    """
    source = environ if slurm is None else slurm
    added = slurm_launcher_env(source)
    for name in ("MASTER_ADDR", "MASTER_PORT"):
        if name not in environ:
            raise SlurmError(f"{name} not set: the job script exports it (the first node's address and a port)")
    environ.update(added)
    return added


def run_module(module: str, argv: list[str]) -> None:
    """Run ``module`` as ``python -m module argv...`` would, as the rank srun made this task."""
    export_rank_env(os.environ)
    sys.argv = [module, *argv]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    usage = ("usage: python -m ddp_tutorial.cluster.jobs list | show NAME | path NAME | MODULE [ARGS...]\n"
             "  MODULE inside a Slurm job, one srun task per rank: srun python -m ddp_tutorial.cluster.jobs ddp_tutorial.training.train")
    if not argv or argv[0] in ("-h", "--help"):
        print(usage)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    try:
        if command == "list":
            for name, what in SCRIPTS.items():
                print(f"{name:20} {what}")
        elif command in ("show", "path"):
            if len(rest) != 1:
                print(usage, file=sys.stderr)
                return 2
            print(script_text(rest[0]) if command == "show" else script_path(rest[0]), end="\n" * (command == "path"))
        else:
            run_module(command, rest)  # the module's own SystemExit carries its exit code
    except (ValueError, SlurmError) as exc:
        print(f"ddp_tutorial.cluster.jobs: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
