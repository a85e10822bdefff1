"""Processes that outlive their job, found and ended by process id; and a spawn target in ``__main__``.

Used by ``12_debugging_and_pitfalls``. ``crash_a_job()`` starts a launcher with
two "ranks" (each holding a listening port, as rank 0's rendezvous store does)
and kills the launcher with SIGKILL, the way an out-of-memory killer or
``kill -9`` does: nothing tells the ranks, so they keep running and keep the
port. ``processes_in_session``/``listeners`` find them by id, ``end_processes``
ends exactly those ids, never "every python process" (``pkill -f python`` would
take your Jupyter kernel and other people's jobs with it). Linux (``/proc``).
Finding ranks by session works for this launcher, not for torchrun, which starts
each worker in a session of its own: find torchrun's orphans by port, or by the
``TORCHELASTIC_RUN_ID`` torchrun puts in every worker's environment.

    python -m ddp_tutorial.pitfalls strays
"""

from __future__ import annotations

import ctypes
import os
import selectors
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass

from ddp_tutorial.launch.procs import children_by_parent
from ddp_tutorial.launch.spec import PLAIN_TEXT

__all__ = ["CrashedJob", "crash_a_job", "alive", "processes_in_session", "descendants", "listeners", "port_in_use",
           "end_processes", "main_module_target"]

_RANK = """
import socket, sys, time
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen()
print(s.getsockname()[1], flush=True)
time.sleep(600)  # a rank in its training loop
"""
_LAUNCHER = """
import subprocess, sys, time
ranks = [subprocess.Popen([sys.executable, "-c", sys.argv[1]], stdout=subprocess.PIPE, text=True)
         for _ in range(int(sys.argv[2]))]
for r in ranks:
    print(r.pid, r.stdout.readline().strip(), flush=True)
time.sleep(600)  # supervising
"""


@dataclass
class CrashedJob:
    launcher_pid: int
    session: int
    rank_pids: list[int]
    ports: list[int]


def _subreaper(on: bool) -> None:
    """Adopt orphans while the launcher dies, so this process can reap them (Linux; else no-op).

    Normally init adopts and reaps them; in some containers PID 1 never reaps and
    ended processes would linger as zombies.
    """
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(36, int(on), 0, 0, 0)  # PR_SET_CHILD_SUBREAPER


def crash_a_job(num_ranks: int = 2, timeout: float = 20.0) -> CrashedJob:
    """Start a launcher with ``num_ranks`` ranks, then SIGKILL the launcher alone."""
    launcher = subprocess.Popen([sys.executable, "-c", _LAUNCHER, _RANK, str(num_ranks)],
                                stdout=subprocess.PIPE, bufsize=0, start_new_session=True)
    out, fd = b"", launcher.stdout.fileno()
    with selectors.DefaultSelector() as sel:  # raw reads: a buffered readline would hide lines from select
        sel.register(fd, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout
        while out.count(b"\n") < num_ranks:
            chunk = os.read(fd, 4096) if sel.select(max(0.0, deadline - time.monotonic())) else b""
            if not chunk:
                os.killpg(launcher.pid, signal.SIGKILL)  # the ranks share the launcher's group
                launcher.wait()
                raise TimeoutError(f"the launcher did not start its ranks within {timeout:g} s")
            out += chunk
    pids, ports = [], []
    for line in out.decode().splitlines():
        pid, port = line.split()
        pids.append(int(pid))
        ports.append(int(port))
    _subreaper(True)
    try:
        os.kill(launcher.pid, signal.SIGKILL)  # the crash: no chance to clean up
        launcher.wait()
    finally:
        _subreaper(False)
    launcher.stdout.close()
    return CrashedJob(launcher.pid, launcher.pid, pids, ports)


def _stat(pid: int) -> tuple[str, int, int, int]:
    """(state, ppid, pgid, session) from /proc/PID/stat."""
    with open(f"/proc/{pid}/stat") as f:
        text = f.read()
    fields = text[text.rindex(")") + 2:].split()
    return fields[0], int(fields[1]), int(fields[2]), int(fields[3])


def _all_pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie has ended; it only waits to be reaped)."""
    try:
        return _stat(pid)[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def processes_in_session(session: int) -> list[int]:
    """Live processes of a session (what ``ps -eo pid,sid,args`` lists).

    A job's processes when its launcher keeps them in its session, as ``crash_a_job``'s
    does; not torchrun's workers, each of which leads a session of its own.
    """
    found = []
    for pid in _all_pids():
        try:
            state, _, _, sid = _stat(pid)
        except (FileNotFoundError, ProcessLookupError):
            continue
        if sid == session and state != "Z":
            found.append(pid)
    return sorted(found)


def descendants(root: int | None = None, skip: str = "multiprocessing.(forkserver|resource_tracker)") -> list[int]:
    """Live descendants of ``root`` (default: this process), not counting helper servers
    whose command line matches ``skip`` (``launch.spawn`` keeps its forkserver on purpose)."""
    import re

    root = os.getpid() if root is None else root
    children = children_by_parent()
    found, todo = [], list(children.get(root, []))
    while todo:
        pid = todo.pop()
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                helper = re.search(skip, f.read().decode(errors="replace")) is not None
        except OSError:
            continue
        if helper:
            # a helper's own children are ranks: they count
            todo += children.get(pid, [])
        else:
            found.append(pid)
            todo += children.get(pid, [])
    return sorted(found)


def listeners(port: int) -> list[int]:
    """Processes listening on a TCP port (what ``ss -ltnp`` or ``fuser -n tcp PORT`` shows)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except FileNotFoundError:
            continue
        for row in rows:
            cols = row.split()
            if cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                inodes.add(f"socket:[{cols[9]}]")
    pids = []
    for pid in _all_pids():
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
            if any(os.readlink(f"/proc/{pid}/fd/{fd}") in inodes for fd in fds):
                pids.append(pid)
        except OSError:  # gone, or not ours to look at
            continue
    return sorted(pids)


def port_in_use(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def end_processes(pids: list[int], grace: float = 3.0) -> list[int]:
    """SIGTERM these ids, SIGKILL what is left after ``grace`` s; return the ids still alive (none)."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        for pid in pids:
            if alive(pid):
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            for pid in pids:
                try:
                    os.waitpid(pid, os.WNOHANG)  # reap it if it is our (adopted) child
                except ChildProcessError:
                    pass
            if not any(alive(pid) for pid in pids):
                return []
            time.sleep(0.05)
    return [pid for pid in pids if alive(pid)]


_MAIN_TARGET = """
import multiprocessing as mp
from ddp_tutorial.launch import spawn

def worker(rank, world_size):  # defined in __main__, as in a notebook cell
    return rank

if __name__ == "__main__":
    try:
        spawn(worker, 2)
    except ValueError as exc:
        print("launch.spawn refuses:", str(exc).split(";")[0])
    # torch.multiprocessing.spawn starts its children with this start method
    child = mp.get_context("spawn").Process(target=worker, args=(0, 1))
    child.start()
    child.join()
    print("mp spawn child exit code:", child.exitcode)
"""


def main_module_target(timeout: float = 60.0) -> list[str]:
    """Run a script whose spawn target lives in ``__main__``; return what it and its child said."""
    run = subprocess.run([sys.executable, "-c", _MAIN_TARGET], capture_output=True, text=True,
                         timeout=timeout, env=dict(os.environ, **PLAIN_TEXT))  # no colour codes (3.13+)
    said = run.stdout.splitlines()
    said += [line for line in run.stderr.splitlines() if line.startswith("AttributeError")]
    return said
