"""The process tree: which live process started which (``launch.torchrun``, ``strays``).

Read from ``/proc`` on Linux, from ``ps`` elsewhere; empty if neither works.
"""

from __future__ import annotations

import os
import subprocess


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
