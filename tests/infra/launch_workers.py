"""Spawn targets for tests/infra/test_launch.py and test_live_output.py (spawned functions must live in an importable module)."""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist


def identify(rank: int, world_size: int) -> tuple:
    # Higher ranks finish first, so ordering by completion would be wrong.
    time.sleep(0.05 * (world_size - rank))
    return rank, world_size, dist.get_rank(), dist.get_world_size(), os.getpid()


def fail_on(rank: int, world_size: int, bad_rank: int, pid_dir: str) -> None:
    _note_pid(pid_dir, rank)
    if rank == bad_rank:
        raise ValueError(f"boom from rank {rank}")
    dist.barrier()  # the others would wait here forever for the failed rank


def hang_on(rank: int, world_size: int, bad_rank: int, pid_dir: str) -> int:
    _note_pid(pid_dir, rank)
    if rank == bad_rank:
        time.sleep(3600)
    _note(pid_dir, f"{rank}.done", "")
    return rank


def hang_with_grandchild(rank: int, world_size: int, pid_dir: str, slow_to_stop: bool = False) -> None:
    """Every rank starts a process of its own (like a DataLoader worker), notes both pids, hangs.

    ``slow_to_stop``: SIGTERM only leaves a ``<rank>.term`` note, so the launcher has
    to wait out its grace period and kill the rank.
    """
    import signal
    import subprocess

    if slow_to_stop:
        signal.signal(signal.SIGTERM, lambda signum, frame: _note(pid_dir, f"{rank}.term", ""))
    grandchild = subprocess.Popen(["sleep", "3600"])
    _note(pid_dir, f"{rank}-grandchild.pid", str(grandchild.pid))
    _note_pid(pid_dir, rank)
    time.sleep(3600)


def die_on(rank: int, world_size: int, bad_rank: int) -> int:
    if rank == bad_rank:
        os._exit(3)
    return rank


def chatty(rank: int, world_size: int) -> None:
    # Rank world_size-1 prints first in wall-clock time; the relay must still be in rank order.
    time.sleep(0.1 * (world_size - 1 - rank))
    print(f"first line of rank {rank}")
    print(f"second line of rank {rank}", flush=True)
    os.write(1, f"raw fd write of rank {rank}\n".encode())


def self_init(rank: int, world_size: int) -> tuple:
    """With init_process_group=False the worker sets up the group itself, from env://."""
    assert not dist.is_initialized()
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        x = torch.ones(3) * (rank + 1)
        dist.all_reduce(x)
        return os.environ["MASTER_ADDR"], x.tolist()
    finally:
        dist.destroy_process_group()


def unpicklable(rank: int, world_size: int):
    return lambda: rank


def _note_pid(pid_dir: str, rank: int) -> None:
    _note(pid_dir, f"{rank}.pid", str(os.getpid()))


def _note(directory: str, name: str, text: str) -> None:
    """Write a file atomically: a reader polling for it never sees it half written."""
    path = os.path.join(directory, name)
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


def leave_grandchild(rank: int, world_size: int) -> int:
    """Start a process that would outlive us (like a DataLoader worker) and return its pid."""
    import subprocess

    return subprocess.Popen(["sleep", "3600"]).pid


def loader_in_worker(rank: int, world_size: int) -> float:
    """A DataLoader with worker processes inside a rank: the rank may have children."""
    from torch.utils.data import DataLoader, TensorDataset

    data = TensorDataset(torch.arange(8, dtype=torch.float32))
    return sum(batch[0].sum().item() for batch in DataLoader(data, batch_size=4, num_workers=1))


def listening_sockets(rank: int, world_size: int) -> tuple:
    """Where this rank (gloo's pair sockets) and the rendezvous store listen."""
    import subprocess

    dist.barrier()
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True).stdout
    dist.barrier()
    local = [line.split()[3] for line in out.splitlines()]
    mine = [addr for line, addr in zip(out.splitlines(), local) if f"pid={os.getpid()}," in line]
    store = [addr for addr in local if addr.endswith(":" + os.environ["MASTER_PORT"])]
    return mine, store


def tick(rank: int, world_size: int, seconds: int, pid_dir: str = "") -> int:
    """Print a line once a second for ``seconds`` seconds (live output: do lines arrive as printed?)."""
    if pid_dir:
        _note_pid(pid_dir, rank)
    for second in range(seconds):
        print(f"tick {second} of rank {rank}", flush=True)
        time.sleep(1.0)
    return rank


def progress_bar(rank: int, world_size: int, steps: int, seconds_per_step: float) -> int:
    """A tqdm bar on rank 0 (shown whatever the output is), then one line on every rank."""
    from tqdm import tqdm

    for _ in tqdm(range(steps), desc="working", disable=rank != 0, leave=False, mininterval=0,
                  bar_format="{desc}: {n_fmt}/{total_fmt}"):  # no rate or time: the text is predictable
        time.sleep(seconds_per_step)
    print(f"rank {rank} done", flush=True)
    return rank


def watched(rank: int, world_size: int) -> bool:
    """Whether this rank is told that its output is shown live (it would show a progress bar)."""
    from ddp_tutorial.launch import watched_live

    return watched_live()


def no_collective(rank: int, world_size: int) -> str | None:
    """Returns at once, without a collective: its teardown must not break a slower peer's init."""
    return os.environ.get("TORCH_DIST_INIT_BARRIER")
