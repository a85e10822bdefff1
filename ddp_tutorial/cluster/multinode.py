"""What a launcher tells each process, several nodes on one machine, restarts and signals (``09_torchrun``).

Every rank reports the variables torchrun set for it; rank 0 gathers the
reports and prints one JSON line per rank (prefix ``WHOAMI``), so the output
is in rank order however the processes interleave. From a shell:

    torchrun --nproc-per-node=2 -m ddp_tutorial.cluster.multinode
    python -m torch.distributed.launch --nproc-per-node=2 --master-port=$PORT -m ddp_tutorial.cluster.multinode
    python -m ddp_tutorial.cluster.multinode                       # one process, a world of one

    # two nodes: run on each machine, NODE=0 on the one at MASTER_ADDR, NODE=1 on the other;
    # MASTER_PORT (and PORT above) is any free port you choose, the same on every node
    torchrun --nnodes=2 --node-rank=$NODE --nproc-per-node=2 \\
        --master-addr=$MASTER_ADDR --master-port=$MASTER_PORT -m ddp_tutorial.cluster.multinode
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

import torch.distributed as dist

from ddp_tutorial.env import cuda_device_count, distributed
from ddp_tutorial.launch import LOCALHOST, TorchrunResult, free_port, run_command, torchrun

__all__ = ["LAUNCHER_VARS", "launcher_env", "resolve_local_rank", "report_ranks", "parse_reports", "log_lines",
           "legacy_launch", "simulate_nodes", "run_and_stop", "main"]

MARK = "WHOAMI "
LAUNCHER_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
                 "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS")


def launcher_env(environ: Mapping[str, str] | None = None) -> dict:
    """The launcher's variables as this process sees them (absent ones are None)."""
    env = os.environ if environ is None else environ
    return {key: env.get(key) for key in LAUNCHER_VARS}


def resolve_local_rank(arg: int | None, environ: Mapping[str, str] | None = None) -> int:
    """``LOCAL_RANK`` from the environment (torchrun), else the legacy ``--local-rank`` argument, else 0.

    ``python -m torch.distributed.launch`` passes ``--local-rank=N`` (``--local_rank=N``
    before PyTorch 2.0) to the script unless given ``--use-env``; torchrun only sets
    ``LOCAL_RANK``. A script that reads both runs under either launcher.
    """
    env = os.environ if environ is None else environ
    if "LOCAL_RANK" in env:
        return int(env["LOCAL_RANK"])
    return 0 if arg is None else arg


def report_ranks(rank: int, world_size: int, local_rank_arg: int | None = None) -> list[dict] | None:
    """Gather every rank's ``launcher_env`` on rank 0 and print it there; return the list on rank 0."""
    report = dict(launcher_env(), local_rank_arg=local_rank_arg,
                  local_rank_used=resolve_local_rank(local_rank_arg), rank_from_group=dist.get_rank())
    reports = [None] * world_size if rank == 0 else None
    dist.gather_object(report, reports, dst=0)
    if rank == 0:
        for r in reports:
            print(MARK + json.dumps(r), flush=True)
    return reports


def parse_reports(output: str) -> list[dict]:
    """The per-rank reports printed by ``main`` inside a launcher's (noisy) output, by rank."""
    found = [json.loads(line.split(MARK, 1)[1]) for line in output.splitlines() if MARK in line]
    return sorted(found, key=lambda r: r["rank_from_group"])


# torchrun's own log prefix: "W1121 12:00:00.000000 123 torch/distributed/run.py:9] "
_LOG_PREFIX = re.compile(r"^\[?[IWEF]\d{4} [\d:.]+ +\d+ [^\]]*\] ?")


def log_lines(output: str, *keep: str) -> list[str]:
    """The lines of a launcher's output that contain one of ``keep``, without timestamps or pids.

    torchrun's own messages carry a time and a process id; the lesson wants the words.
    """
    found = []
    for line in output.splitlines():
        if any(k in line for k in keep):
            line = _LOG_PREFIX.sub("", line)
            line = re.sub(r" of binary: \S+", "", line)
            found.append(re.sub(r"(process|pid:?) \d+", r"\1 PID", line).strip())
    return found


def legacy_launch(module: str, nproc_per_node: int = 2, args: Sequence[str] = (),
                  timeout: float = 120.0) -> TorchrunResult:
    """Run ``module`` under the deprecated ``python -m torch.distributed.launch`` on a free port.

    Through ``launch.run_command``: ``TimeoutError`` after ``timeout`` seconds, and
    the launcher and its workers are gone when this returns.
    """
    cmd = [sys.executable, "-m", "torch.distributed.launch", f"--nproc-per-node={nproc_per_node}",
           f"--master-addr={LOCALHOST}", f"--master-port={free_port()}", "-m", module, *map(str, args)]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return run_command(cmd, timeout=timeout, env=env, name="torch.distributed.launch",
                       status=f"starting torch.distributed.launch with {nproc_per_node} processes...")


def node_visible_devices(node_rank: int, nproc_per_node: int, nnodes: int, cuda_devices: int,
                         visible: str | None = None) -> str:
    """``CUDA_VISIBLE_DEVICES`` for one simulated node: its own GPUs, or none at all.

    Real nodes each have their own GPUs. Simulated on one machine, every node would
    pick ``cuda:LOCAL_RANK`` from the same GPUs and NCCL would refuse two ranks on one
    GPU ("Duplicate GPU detected"). So node k sees GPUs ``k * nproc_per_node`` onwards;
    with too few GPUs for all nodes, none sees any and they all use gloo on the CPU.
    ``visible`` is the caller's own ``CUDA_VISIBLE_DEVICES``, if set: indices count in it.
    """
    if cuda_devices < nnodes * nproc_per_node:
        return ""
    ids = visible.split(",") if visible else [str(d) for d in range(cuda_devices)]
    first = node_rank * nproc_per_node
    return ",".join(ids[first:first + nproc_per_node])


def simulate_nodes(nnodes: int = 2, nproc_per_node: int = 2, rendezvous: str = "static",
                   module: str = "ddp_tutorial.cluster.multinode", timeout: float = 120.0) -> list[TorchrunResult]:
    """Start ``nnodes`` torchrun agents on 127.0.0.1 at once, as if each were another machine.

    ``static``: node ranks given (``--node-rank``), node 0 hosts the store at
    ``--master-addr:--master-port``. ``c10d``: the agents meet at ``--rdzv-endpoint``
    and number the nodes by sorting them (host name, then the agent's process id), not
    by arrival, so do not count on a particular machine getting node rank 0; read
    ``GROUP_RANK`` / ``RANK`` from the environment.
    """
    port = free_port()

    def node(node_rank: int) -> TorchrunResult:
        if rendezvous == "static":
            opts = dict(nnodes=nnodes, node_rank=node_rank, master_addr=LOCALHOST, master_port=port)
        elif rendezvous == "c10d":
            opts = dict(nnodes=nnodes, rdzv_backend="c10d", rdzv_endpoint=f"{LOCALHOST}:{port}",
                        rdzv_id="tutorial")
        else:
            raise ValueError(f"rendezvous must be 'static' or 'c10d', got {rendezvous!r}")
        gpus = node_visible_devices(node_rank, nproc_per_node, nnodes, cuda_device_count(),
                                    os.environ.get("CUDA_VISIBLE_DEVICES"))
        env = dict(os.environ, CUDA_VISIBLE_DEVICES=gpus)
        return torchrun(module, nproc_per_node, timeout=timeout, env=env, **opts)

    with ThreadPoolExecutor(nnodes) as pool:
        return list(pool.map(node, range(nnodes)))


def run_and_stop(module: str, args: Sequence[str], stop_when: str, nproc_per_node: int = 2,
                 sig: int = signal.SIGTERM, timeout: float = 120.0) -> TorchrunResult:
    """Run torchrun, and send ``sig`` to the torchrun agent once a line contains ``stop_when``.

    Shows what Ctrl-C (SIGINT) or a scheduler's SIGTERM does to a job: the agent
    forwards the signal to every worker, waits for them, and exits non-zero.
    """
    sent = []

    def stop(line: str, agent: subprocess.Popen) -> None:
        if not sent and stop_when in line:
            agent.send_signal(sig)  # the agent only: it is torchrun's job to stop the workers
            sent.append(sig)

    return torchrun(module, nproc_per_node, args, timeout=timeout, check=False, threads=1, on_line=stop)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ddp_tutorial.cluster.multinode", description=__doc__.split("\n\n")[0])
    # The legacy launcher appends --local-rank=N (or --local_rank=N); accept both spellings.
    parser.add_argument("--local-rank", "--local_rank", dest="local_rank", type=int, default=None)
    args = parser.parse_args(argv)
    with distributed() as (info, _device):
        report_ranks(info.rank, info.world_size, args.local_rank)
    return 0


if __name__ == "__main__":
    sys.exit(main())
