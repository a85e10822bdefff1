"""Elastic torchrun for real: a node joins, a node leaves, the workers restart from the last
checkpoint with the new world size; and the failing rank's own traceback (``16_cluster``).

``09_torchrun`` restarted a crashed run on one node with ``--max-restarts``. Here the
number of nodes changes while the job runs: ``--nnodes=1:2`` lets it run on one node or
two, the c10d rendezvous lets a node join a running job (every worker restarts, the
world grows) and lets the job go on when one leaves (the workers fail, restart, and the
world shrinks). Training resumes from rank 0's checkpoint each time. From a shell:

    # the same command on 1 or 2 machines (or in two shells on one): HOST is the first one's
    torchrun --nnodes=1:2 --nproc-per-node=1 --max-restarts=3 --rdzv-backend=c10d \\
        --rdzv-endpoint=$HOST:29400 --rdzv-id=job42 \\
        -m ddp_tutorial.cluster.elastic --epochs 40 --checkpoint ckpt.pt --resume

    # the failing rank's traceback in torchrun's report and in error.json; every rank's
    # output in files under logs/, and rank 0's also on the console, prefixed [default0]:
    TORCHELASTIC_ERROR_FILE=error.json torchrun --master-addr=127.0.0.1 --master-port=29500 --nproc-per-node=2 \\
        --log-dir=logs --redirects=3 --tee=3 --local-ranks-filter=0 \\
        -m ddp_tutorial.cluster.elastic --raise-on-rank 1

``python -m ddp_tutorial.cluster.elastic`` is ``python -m ddp_tutorial.training.train`` under ``@record``
(torch's decorator that writes an uncaught exception to ``TORCHELASTIC_ERROR_FILE``),
with ``--raise-on-rank R`` to fail on purpose. ``join_and_leave`` and ``record_failure``
run both demos on one machine; ``tests/slurm/test_elastic.py`` asserts what they show.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

from ddp_tutorial.env import distributed, rank_info
from ddp_tutorial.launch import LOCALHOST, TorchrunResult, free_port, torchrun
from ddp_tutorial.training import train

__all__ = ["RENDEZVOUS_CONF", "join_and_leave", "replay", "record_failure", "checkpoint_world_sizes", "main"]

# Seconds, not torch's defaults (600 s to join, 30 s of last call): a demo on one machine.
# last_call: once the minimum number of nodes is there, how long to wait for more.
# keep_alive: a node that stops sending heartbeats leaves the rendezvous after interval * attempts.
RENDEZVOUS_CONF = "join_timeout=60,last_call_timeout=2,close_timeout=10,keep_alive_interval=1,keep_alive_max_attempt=3"


def checkpoint_world_sizes(path: str) -> list[int]:
    """Each finished epoch's world size, as rank 0's checkpoint records them (empty before one)."""
    try:
        return list(torch.load(path, weights_only=True)["world_sizes"])
    except (FileNotFoundError, EOFError, RuntimeError, KeyError):
        return []


def _agent(port: int, train_args: list[str], timeout: float, log_dir: str, started: list,
           hosts_store: bool) -> TorchrunResult:
    # is_host: on one machine both agents would take 127.0.0.1 as their own address and each host
    # a store on the port; on a real cluster only the endpoint's machine matches.
    opts = dict(nnodes="1:2", max_restarts=3, rdzv_backend="c10d", rdzv_endpoint=f"{LOCALHOST}:{port}",
                rdzv_id="elastic-demo", rdzv_conf=f"{RENDEZVOUS_CONF},is_host={int(hosts_store)}",
                monitor_interval=0.5, log_dir=log_dir)
    # The agents' rendezvous store, shared with the workers (torch's default), deadlocked the
    # round after a node joined in our runs (torch 2.14, two agents on one machine): the workers get
    # a store of their own instead.
    # LOGLEVEL=INFO: the agents say each rendezvous's result (global_world_sizes=[...]) and restart.
    env = dict(os.environ, TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1", LOGLEVEL="INFO")

    def seen(line: str, proc: subprocess.Popen) -> None:
        if not started:
            started.append(proc)

    return torchrun("ddp_tutorial.cluster.elastic", 1, train_args, timeout=timeout, check=False, threads=1,
                    env=env, on_line=seen, **opts)


def join_and_leave(workdir: str, num_epochs: int = 40, timeout: float = 180.0) -> dict[str, Any]:
    """Agent A trains alone; agent B joins (world 1 -> 2); B is stopped (SIGTERM, as a scheduler
    takes a node back: world 2 -> 1); A finishes. Both run on 127.0.0.1, one process each.

    Returns both outputs and exit codes and the checkpoint's per-epoch world sizes.
    """
    checkpoint = os.path.join(workdir, "elastic.pt")
    if os.path.exists(checkpoint):
        os.unlink(checkpoint)  # a fresh run: A must start alone, from scratch
    args = ["--epochs", num_epochs, "--checkpoint", checkpoint, "--resume"]
    port, deadline = free_port(), time.monotonic() + timeout
    a_started, b_started = [], []

    def wait_for(what: str, ready) -> None:
        while not ready():
            if time.monotonic() > deadline or a.done():
                raise RuntimeError(f"elastic demo: never saw {what}; agent A: "
                                   f"{a.result().output if a.done() else 'still running'}")
            time.sleep(0.2)

    with ThreadPoolExecutor(2) as pool:
        a = pool.submit(_agent, port, args, timeout, os.path.join(workdir, "logs-a"), a_started, True)
        wait_for("A's first epoch", lambda: len(checkpoint_world_sizes(checkpoint)) >= 1)
        b = pool.submit(_agent, port, args, timeout, os.path.join(workdir, "logs-b"), b_started, False)
        wait_for("an epoch with both nodes", lambda: 2 in checkpoint_world_sizes(checkpoint))
        wait_for("agent B's first line", lambda: b_started)
        b_started[0].send_signal(signal.SIGTERM)  # the agent stops its workers: the node leaves
        a_result, b_result = a.result(), b.result()
    return {"a": a_result, "b": b_result, "world_sizes": checkpoint_world_sizes(checkpoint),
            "checkpoint": checkpoint}


def replay(world_sizes: list[int], workdir: str, timeout: float = 120.0) -> str:
    """The same training without elasticity: one plain torchrun per stretch of equal world size, each
    resuming from the last. Equal weights show the elastic run lost nothing and repeated nothing.
    """
    checkpoint = os.path.join(workdir, "replay.pt")
    end = 0
    while end < len(world_sizes):
        size = world_sizes[end]
        while end < len(world_sizes) and world_sizes[end] == size:
            end += 1
        torchrun("ddp_tutorial.training.train", size, ["--epochs", end, "--checkpoint", checkpoint, "--resume"],
                 timeout=timeout, threads=1)
    return checkpoint


def record_failure(workdir: str, nproc_per_node: int = 2, failing_rank: int = 1,
                   timeout: float = 120.0) -> dict[str, Any]:
    """Run ``--raise-on-rank`` under ``@record`` with the agent's error file, log files and a console
    filtered to local rank 0. Returns the output, exit code, the error file's JSON and the log files.
    """
    error_file = os.path.join(workdir, "error.json")
    log_dir = os.path.join(workdir, "logs")
    env = dict(os.environ, TORCHELASTIC_ERROR_FILE=error_file)
    result = torchrun("ddp_tutorial.cluster.elastic", nproc_per_node, ["--raise-on-rank", failing_rank], timeout=timeout,
                      check=False, threads=1, env=env, log_dir=log_dir, redirects=3, tee=3,
                      local_ranks_filter=0)
    with open(error_file) as f:
        error = json.load(f)
    logs = {os.path.relpath(p, log_dir).split(os.sep, 1)[1]: p
            for p in sorted(glob.glob(os.path.join(log_dir, "*", "attempt_*", "*", "*")))}
    return {"result": result, "error": error, "logs": logs}


class DeliberateError(RuntimeError):
    """What ``--raise-on-rank`` raises: a Python exception, so ``@record`` has a traceback to report."""


@record  # an uncaught exception in this rank -> TORCHELASTIC_ERROR_FILE (torchrun gives each rank its own)
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ddp_tutorial.cluster.elastic", add_help=False)
    parser.add_argument("--raise-on-rank", type=int, default=None)
    args, rest = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    info = rank_info(module="ddp_tutorial.cluster.elastic")
    if args.raise_on_rank is not None:
        print(f"rank {info.rank}: started", flush=True)
        with distributed():
            dist.barrier()  # every rank has started (and printed) before one fails
            if args.raise_on_rank == info.rank:
                raise DeliberateError(f"rank {info.rank} raises on purpose, to show @record's report")
            time.sleep(30)  # the others wait: torchrun stops them when the failing rank exits
    return train.main(rest)


if __name__ == "__main__":
    sys.exit(main())
