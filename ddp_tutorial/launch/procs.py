"""Processes: which live one started which, and stopping a group of them (both launchers, ``pitfalls.strays``).

The tree is read from ``/proc`` on Linux, from ``ps`` elsewhere; empty if neither works.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from contextlib import contextmanager
from typing import Iterator


def children_by_parent() -> dict[int, list[int]]:
    """Parent pid -> the pids of its live children (zombies left out: they are already gone)."""
    children: dict[int, list[int]] = {}
    for pid, ppid in _parent_links():
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


def _parent_links() -> list[tuple[int, int]]:
    """(pid, parent pid) of every live process."""
    if os.path.isdir("/proc"):
        links = []
        for name in os.listdir("/proc"):
            if name.isdigit():
                try:
                    with open(f"/proc/{name}/stat") as f:
                        state, ppid = f.read().rsplit(")", 1)[1].split()[:2]  # the name may hold spaces
                except (OSError, IndexError, ValueError):
                    continue
                if state != "Z":
                    links.append((int(name), int(ppid)))
        return links
    try:
        out = subprocess.run(["ps", "-A", "-o", "pid=,ppid=,stat="], capture_output=True, text=True,
                             timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    fields = [line.split() for line in out.splitlines()]
    return [(int(f[0]), int(f[1])) for f in fields if len(f) == 3 and not f[2].startswith("Z")]


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
