"""Processes: which live one started which, and stopping a group of them (both launchers, ``pitfalls.strays``).

The tree is read from ``/proc`` on Linux, from ``ps`` elsewhere; empty if neither works.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager


def children_by_parent() -> dict[int, list[int]]:
    """Parent pid -> the pids of its live children (zombies left out: they are already gone)."""
    children: dict[int, list[int]] = {}
    for pid, ppid, _ in _processes():
        children.setdefault(ppid, []).append(pid)
    return children


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid``: children, their children, and so on."""
    children = children_by_parent()
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def still_running(pids: Sequence[int], wait: float = 2.0) -> list[int]:
    """Which of ``pids``, and of the processes in the groups they lead, are alive (zombies are not).

    A launcher asks before it tells the user that nothing is left running. A process
    sent SIGKILL a moment ago may still be on its way out: up to ``wait`` seconds for it.
    """
    wanted, deadline = set(pids), time.monotonic() + wait
    while True:
        left = sorted(pid for pid, _, pgid in _processes() if pid in wanted or pgid in wanted)
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.02)


def _processes() -> list[tuple[int, int, int]]:
    """(pid, parent pid, process group) of every live process."""
    if os.path.isdir("/proc"):
        found = []
        for name in os.listdir("/proc"):
            if name.isdigit():
                try:
                    with open(f"/proc/{name}/stat") as f:
                        state, ppid, pgid = f.read().rsplit(")", 1)[1].split()[:3]  # the name may hold spaces
                except (OSError, IndexError, ValueError):
                    continue
                if state != "Z":
                    found.append((int(name), int(ppid), int(pgid)))
        return found
    try:
        out = subprocess.run(["ps", "-A", "-o", "pid=,ppid=,pgid=,stat="], capture_output=True, text=True,
                             timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    fields = [line.split() for line in out.splitlines()]
    return [(int(f[0]), int(f[1]), int(f[2])) for f in fields if len(f) == 4 and not f[3].startswith("Z")]


def signal_group(pid: int, sig: int, *, leader_too: bool = True) -> None:
    """Send ``sig`` to the process group ``pid`` leads and (``leader_too``) to ``pid`` itself.

    Both, because a process may have left its group, yet is still reached by its pid.
    Processes that are already gone (or not ours) are skipped silently.
    """
    kills = (os.killpg, os.kill) if leader_too else (os.killpg,)
    for kill in kills:
        try:
            kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


@contextmanager
def interrupts_held_back() -> Iterator[None]:
    """Hold SIGINT back inside the block and deliver it afterwards, to whatever handles it.

    A launcher stopping its processes must finish: a second Ctrl-C (an impatient
    user) raised half-way through would leave some of them running.
    """
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) is None:
        yield  # only the main thread can set handlers; None: a handler not set from Python
        return
    held = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: held.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if held:
            signal.raise_signal(signal.SIGINT)  # by default: KeyboardInterrupt, right here
