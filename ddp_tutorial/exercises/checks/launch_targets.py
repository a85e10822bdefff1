"""The workers exercise 3.1's checker hands to the learner's ``launch_ranks``: standard library only.

``lesson_start_methods`` copies this file beside the learner's, under its own top-level
name, so that a spawned child imports it in milliseconds (under this package's name it
would import torch first, through ``ddp_tutorial.exercises``). Each worker runs as
``worker(rank, world_size, folder)`` and first writes what its process saw into ``folder``
(``record``): its pid, its parent's, and ``MARK``, which the checker changes after the
import, so only a child that is a copy of the checker's memory (``fork``) sees the change.
"""

from __future__ import annotations

import fcntl
import json
import os
import time

MARK = "as imported"
CHANGED = "changed by the checker after the import"
CHECKER_PID = 0  # set by the checker: a worker called in the checker's own process must not wait there
PATIENCE = 30.0  # seconds a rank waits for its neighbour; never reached when the launcher is right
HANG = 60.0  # how long the hanging rank sleeps: the checker stops it long before
HELD = []  # lock files kept open until the process exits (the kernel releases them then)


def record(rank: int, folder: str) -> None:
    """Write this process's facts to ``folder/facts-<rank>.json``, atomically."""
    facts = {"pid": os.getpid(), "ppid": os.getppid(), "mark": MARK}
    tmp = os.path.join(folder, f".facts-{rank}.tmp")
    with open(tmp, "w") as f:
        json.dump(facts, f)
    os.replace(tmp, os.path.join(folder, f"facts-{rank}.json"))  # a reader never sees half a file


def facts(folder: str, world_size: int) -> dict[int, dict]:
    """The facts the ranks of a launch recorded, by rank (a rank that never ran is missing)."""
    found = {}
    for rank in range(world_size):
        path = os.path.join(folder, f"facts-{rank}.json")
        if os.path.exists(path):
            with open(path) as f:
                found[rank] = json.load(f)
    return found


def value(rank: int, world_size: int) -> int:
    """What every worker here returns for ``rank``: different for each rank and world size."""
    return rank * 10 + world_size


def wait_for(path: str, *, shared_lock: bool = False) -> None:
    """Wait until ``path`` exists (or, with ``shared_lock``, until no process holds its lock)."""
    deadline = time.monotonic() + PATIENCE
    while time.monotonic() < deadline:
        if shared_lock:
            with open(path) as f:
                try:
                    fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
                    return
                except BlockingIOError:
                    pass
        elif os.path.exists(path):
            return
        time.sleep(0.005)
    raise TimeoutError(f"waited {PATIENCE:g} s for {os.path.basename(path)}: was every rank started at once?")


def finish_in_reverse(rank: int, world_size: int, folder: str, *, ordered: bool = True) -> int:
    """Return ``value(rank, world_size)``; rank r only once rank r + 1's process has exited.

    So results reach the parent highest rank first, whatever the machine's speed: rank r + 1
    holds a lock on its file until its process ends (after it has sent its result), and rank r
    waits for that lock. ``ordered=False`` skips the waiting: the checker's own reference.
    """
    if ordered:
        record(rank, folder)
        if os.getpid() == CHECKER_PID:
            raise RuntimeError("finish_in_reverse was called in the checker's own process, not in a child")
        lock = open(os.path.join(folder, f"lock-{rank}"), "w")
        fcntl.flock(lock, fcntl.LOCK_EX)
        HELD.append(lock)  # never closed here: released when this process exits
        open(os.path.join(folder, f"locked-{rank}"), "w").close()
        if rank + 1 < world_size:
            wait_for(os.path.join(folder, f"locked-{rank + 1}"))
            wait_for(os.path.join(folder, f"lock-{rank + 1}"), shared_lock=True)
    return value(rank, world_size)


def fails_on_rank_1(rank: int, world_size: int, folder: str) -> int:
    """Rank 1 raises ``ValueError``; the others return ``value``."""
    record(rank, folder)
    if rank == 1:
        raise ValueError("rank 1 fails on purpose")
    return value(rank, world_size)


def exits_on_rank_1(rank: int, world_size: int, folder: str) -> int:
    """Rank 1 ends its process with exit code 3, no exception; the others return ``value``."""
    record(rank, folder)
    if rank == 1:
        os._exit(3)
    return value(rank, world_size)


def hangs_on_rank_1(rank: int, world_size: int, folder: str) -> int:
    """Rank 1 sleeps far past any timeout the checker gives; the others return ``value``."""
    record(rank, folder)
    if rank == 1:
        time.sleep(HANG)
    return value(rank, world_size)


def state(pid: int) -> str:
    """``"running"``, ``"zombie"`` (ended, never joined) or ``"gone"``, for a process ``pid``."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return "gone"
    except PermissionError:
        return "running"  # someone else's process now holds the number
    try:
        with open(f"/proc/{pid}/stat") as f:
            return "zombie" if f.read().rsplit(")", 1)[1].split()[0] == "Z" else "running"
    except OSError:
        return "running"  # no /proc (macOS): a zombie cannot be told apart
