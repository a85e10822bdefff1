"""Processes: which live one started which, stopping a group of them, and what a rank left running.

Used by both launchers and ``pitfalls.strays``. The tree is read from ``/proc`` on Linux,
from ``ps`` elsewhere; empty if neither works.

How ``launch.spawn`` makes sure that nothing a rank started outlives the launch, sessions
included (``start_new_session=True`` leaves the rank's process group, so stopping the
group misses it):

- every rank is a *child subreaper* (Linux's ``PR_SET_CHILD_SUBREAPER``): a process it
  started whose parent dies is adopted by the rank, not by init, so walking the rank's tree
  finds every descendant, double forks and new sessions included, for as long as the rank
  lives. Walking alone would miss an orphan: its parent pid is then 1.
- the tree is walked, and what it holds killed (``kill_descendants``), by the rank itself
  once its code is done, and by the launcher (``launch.stopping``) before it stops a rank that
  is still running (paused first with SIGSTOP, so that it cannot start another meanwhile).
- a rank that dies abruptly (``os._exit``, a crash) cannot walk its tree any more, and its
  orphans go to init. For those, every rank's environment carries a tag (``TAG_ENV``) that
  each program it starts inherits; ``kill_tagged`` finds them afterwards in ``/proc/*/environ``.
  The tag alone would not do: ``/proc/PID/environ`` is the environment a program was
  *started* with, so a child forked without a new program (``os.fork``, multiprocessing's
  fork) does not show it, and neither does one started with an environment of its own.
"""

from __future__ import annotations

import ctypes
import glob
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import NamedTuple

TAG_ENV = "DDP_TUTORIAL_LAUNCH"  # "<launch id>:<rank>" in every rank's environment, inherited by what it starts
# Servers multiprocessing starts for a process and which end with it (a rank that used
# multiprocessing has them until it exits): not left over, but what they started is.
HELPERS = re.compile(r"multiprocessing\.(forkserver|resource_tracker)")
PR_SET_CHILD_SUBREAPER = 36


class Leftover(NamedTuple):
    """A process a rank's code started and left running, which the launch then stopped."""

    rank: int
    pid: int
    command: str


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


def become_subreaper() -> bool:
    """Adopt this process's orphaned descendants (Linux); False where the system cannot."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def command_line(pid: int) -> str:
    """What ``pid`` runs, as ``ps -o args`` shows it ("" once it is gone)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().rstrip(b"\0").replace(b"\0", b" ").decode(errors="replace")
    except FileNotFoundError:
        return ""
    except OSError:
        pass
    try:
        return subprocess.run(["ps", "-o", "args=", "-p", str(pid)], capture_output=True, text=True,
                              timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def has_children(pid: int) -> bool:
    """True when ``pid`` has a live child, or when that cannot be told quickly (then walk the tree to know)."""
    paths = glob.glob(f"/proc/{pid}/task/*/children")  # none: no /proc, or a kernel without these files
    if not paths:
        return True
    for path in paths:  # one per thread: a child is listed under the thread that started it
        try:
            with open(path) as f:
                if f.read().strip():
                    return True
        except OSError:
            return True
    return False


def kill_descendants(root: int, *, rounds: int = 50) -> list[tuple[int, str]]:
    """SIGKILL every live descendant of ``root``; return ``(pid, command)`` of each.

    multiprocessing's own servers (``HELPERS``) are spared, not what they started. The
    tree is walked again until a walk finds nothing new: a process killed cannot start
    another, and with ``root`` a subreaper (or stopped) what they started stays below it.
    """
    killed: dict[int, str] = {}
    seen: set[int] = set()
    if os.path.isdir("/proc") and not has_children(root):
        return []
    for _ in range(rounds):
        new = [pid for pid in _tree(root) if pid not in seen]
        if not new:
            break
        for pid in new:
            seen.add(pid)
            command = command_line(pid)
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                continue
            # "": it was ending by itself (an exiting process's command line reads empty, e.g. a DataLoader
            # worker its loader terminated a moment before); only what would have kept running is named
            if command:
                killed[pid] = command
    return list(killed.items())


def _tree(root: int) -> list[int]:
    """The live descendants of ``root`` that are not multiprocessing's helpers."""
    children = children_by_parent()
    found, todo = [], list(children.get(root, []))
    while todo:
        pid = todo.pop()
        todo += children.get(pid, [])
        if not HELPERS.search(command_line(pid)):
            found.append(pid)
    return found


def kill_tagged(tag_prefix: str, *, rounds: int = 50) -> list[tuple[int, str, str]]:
    """SIGKILL every live process started with ``TAG_ENV=<tag_prefix>...``; return ``(pid, tag, command)`` of each.

    Linux only (``/proc/PID/environ``; processes not ours to read are skipped); helpers spared.
    Scanned again until nothing new: what one of them started meanwhile carries the tag too.
    """
    killed: dict[int, tuple[str, str]] = {}
    for _ in range(rounds):
        new = [(pid, tag) for pid, tag in _tagged(f"{TAG_ENV}={tag_prefix}".encode()) if pid not in killed]
        if not new:
            break
        for pid, tag in new:
            killed[pid] = (tag, command_line(pid))
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    return [(pid, tag, command) for pid, (tag, command) in killed.items()]


def _tagged(wanted: bytes) -> list[tuple[int, str]]:
    found = []
    for pid, _, _ in _processes() if os.path.isdir("/proc") else ():
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                entries = f.read().split(b"\0")
        except OSError:
            continue
        tag = next((e for e in entries if e.startswith(wanted)), None)
        if tag is not None and not HELPERS.search(command_line(pid)):
            found.append((pid, tag.decode(errors="replace").split("=", 1)[1]))
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
