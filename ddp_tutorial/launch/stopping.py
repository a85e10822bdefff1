"""The end of a ``launch.spawn``: every rank stopped, and everything it started, sessions included.

How nothing a rank started can escape (the reasons are in ``launch.procs``): each rank is a
subreaper and, once its code is done, kills what it left running and says so in its last
message (``child.run_rank``); a rank still running is paused, what it started killed, then
the rank itself; last, whatever carries the launch's tag. ``stop_ranks`` gathers what was
left running, by rank, for the exercise checker to tell the learner.
"""

from __future__ import annotations

import multiprocessing as mp
import pickle
import signal
import time
from collections.abc import Sequence
from multiprocessing.connection import Connection

from ddp_tutorial.launch.procs import (
    Leftover,
    interrupts_held_back,
    kill_descendants,
    kill_tagged,
    signal_group,
    still_running,
)


def stop_ranks(procs: Sequence[mp.process.BaseProcess], readers: Sequence[Connection], tag: str,
               left: dict[int, Leftover]) -> None:
    """Stop every rank and everything it started; wait until they are gone; close ``readers``.

    ``readers`` are the ranks' pipes, by rank; ``tag`` the launch's ``procs.TAG_ENV`` (before
    ``:<rank>``). ``left`` gets, by pid, what was stopped besides the ranks. A rank still running is
    paused first (SIGSTOP), so that it cannot start anything while what it started is killed; then it
    gets SIGTERM (the exercise checker's ranks write where they are stuck then) and, after a grace,
    SIGKILL. A Ctrl-C meanwhile (the user pressing it again) waits until they are gone: raised
    half-way, it would leave processes running.
    """
    with interrupts_held_back():
        running = [(rank, p.pid) for rank, p in enumerate(procs) if p.pid is not None and p.is_alive()]
        for _, pid in running:
            signal_group(pid, signal.SIGSTOP, leader_too=False)
        for rank, pid in running:
            for child, command in kill_descendants(pid):
                left.setdefault(child, Leftover(rank, child, command))
        for sig, grace in ((signal.SIGTERM, 1.0), (signal.SIGKILL, 5.0)):
            for p in procs:
                if p.pid is not None:
                    # Resumed first: a signal sent to a running process goes to its main thread, where
                    # Python's handlers run; sent while it is stopped, any thread may take it on resuming.
                    signal_group(p.pid, signal.SIGCONT)
                    signal_group(p.pid, sig)  # each rank leads its own group (child.run_rank)
            deadline = time.monotonic() + grace
            for p in procs:
                p.join(max(0.0, deadline - time.monotonic()))
            if not any(p.is_alive() for p in procs):
                break
        for pid, rank_tag, command in kill_tagged(f"{tag}:"):
            left.setdefault(pid, Leftover(int(rank_tag.rsplit(":", 1)[1]), pid, command))
        _read_what_was_left(readers, left)
        if left:
            still_running(list(left))  # SIGKILLed: gone within moments
        for conn in readers:
            conn.close()


def _read_what_was_left(readers: Sequence[Connection], left: dict[int, Leftover]) -> None:
    """Add what each rank said it stopped (its last message, ``child.run_rank``) to ``left``."""
    for rank, conn in enumerate(readers):
        try:
            while conn.poll():
                message = pickle.loads(conn.recv_bytes())
                if message[0] == "left":
                    for pid, command in message[1]:
                        left.setdefault(pid, Leftover(rank, pid, command))
        except (EOFError, OSError):
            continue
