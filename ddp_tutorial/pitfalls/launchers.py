"""Launcher pitfalls: a port already in use, and ``--local_rank`` versus ``LOCAL_RANK``.

Used by ``12_debugging_and_pitfalls`` (the fix for the second is
``multinode.resolve_local_rank`` from ``09_torchrun``). Run as a script, this module
is written the old way on purpose: it reads ``--local_rank``, the argument the
deprecated ``torch.distributed.launch`` passed, and reports what each rank sees:

    torchrun --nproc-per-node=2 -m ddp_tutorial.pitfalls.launchers                    # LOCAL_RANK only
    torchrun --nproc-per-node=2 -m ddp_tutorial.pitfalls.launchers --local-rank=1     # new spelling: refused
    python -m torch.distributed.launch --nproc-per-node=2 --master-port=$PORT -m ddp_tutorial.pitfalls.launchers
"""

from __future__ import annotations

import argparse
import re
import socket
from collections.abc import Sequence
from datetime import timedelta

import torch.distributed as dist

from ddp_tutorial.env import choose_backend, choose_device, launcher_variable, rank_info, whole_lines
from ddp_tutorial.launch import LOCALHOST
from ddp_tutorial.pitfalls.outcomes import clean_message

__all__ = ["store_on_busy_port", "store_on_port_zero", "local_rank_report", "local_rank_as_launched", "main"]


def store_on_busy_port() -> str:
    """Start a rendezvous store on a port another process is listening on; return the error."""
    with socket.socket() as squatter:  # stands for the store of a previous run that never ended
        squatter.bind((LOCALHOST, 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        try:
            dist.TCPStore(LOCALHOST, port, 1, is_master=True, timeout=timedelta(seconds=3))
        except RuntimeError as exc:
            found = re.search(r"name: (\w+), message: ([^\n]+)", str(exc))
            return f"{type(exc).__name__}: " + (f"{found[1]} ({found[2]})" if found else clean_message(str(exc)))
    return "no error"


def store_on_port_zero() -> bool:
    """Port 0 asks the kernel for a free port: what ``launch.spawn`` and ``torchrun --standalone`` do."""
    store = dist.TCPStore(LOCALHOST, 0, 1, is_master=True, timeout=timedelta(seconds=3))
    return store.port > 0


def local_rank_report(args: argparse.Namespace) -> None:
    """Print what this rank gets from ``--local_rank``, from ``LOCAL_RANK`` and from the fix."""
    from ddp_tutorial.cluster.multinode import resolve_local_rank  # the fix, from 09_torchrun

    rank = rank_info()
    # The raw variable is the lesson here: what the launcher did or did not set.
    info = f"rank {rank.rank}: --local_rank gives {args.local_rank}, " \
           f"LOCAL_RANK gives {launcher_variable('LOCAL_RANK')}, " \
           f"resolve_local_rank gives {resolve_local_rank(None)}"
    device = choose_device(rank.local_rank, choose_backend(local_world_size=rank.local_world_size))
    print(f"{info} -> device {device}")


def local_rank_as_launched(rank: int, world_size: int, argv: Sequence[str]) -> None:
    """Run this module's ``main(argv)`` in a rank, the way torchrun runs a script in each process."""
    main(list(argv))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ddp_tutorial.pitfalls.launchers", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    # Written the old way on purpose: torch.distributed.launch passed --local_rank=N
    # (--local-rank=N since torch 2.0); torchrun passes nothing and sets LOCAL_RANK.
    parser.add_argument("--local_rank", type=int, default=0)
    args = parser.parse_args(argv)
    whole_lines()  # torchrun's ranks share one stdout: keep each rank's line whole
    local_rank_report(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
