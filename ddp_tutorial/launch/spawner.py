"""``launch.spawn``: start the ranks, show their output, collect their results, stop them all.

``launch.warm_up`` starts the forkserver ahead of the first launch.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import secrets
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from multiprocessing.connection import Connection, wait
from typing import Any

from ddp_tutorial.launch.child import children_skip_main, context, is_warm, no_op, run_rank
from ddp_tutorial.launch.errors import (
    LaunchInterrupted,
    Report,
    WorkerTimeout,
    is_init_flake,
    rank_range,
    stopped_message,
    worker_error,
)
from ddp_tutorial.launch.live import LiveView, choose_view
from ddp_tutorial.launch.output import RankOutput, in_progress, relay
from ddp_tutorial.launch.procs import TAG_ENV, Leftover, interrupts_held_back, still_running
from ddp_tutorial.launch.spec import LOCALHOST, LaunchSpec
from ddp_tutorial.launch.stopping import stop_ranks

POLL_SECONDS = 0.1  # how often rank output is read while it is shown live


def spawn(fn: Callable[..., Any], world_size: int = 2, args: Sequence[Any] = (), *,
          backend: str | None = None, timeout: float = 60.0, init_process_group: bool = True,
          threads: int | None = None, master_addr: str = LOCALHOST, quiet: bool = False,
          live: bool | None = None, leftovers: list[Leftover] | None = None) -> list:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` processes; return results by rank.

    ``init_process_group=True`` sets up the default group (``backend`` or the
    best available, see ``ddp_tutorial.env.choose_backend``) before ``fn`` and
    destroys it afterwards. With ``False`` only ``MASTER_ADDR``/``MASTER_PORT``
    are set and ``fn`` calls ``dist.init_process_group`` itself. Each rank uses
    ``threads`` torch threads (default: the cores shared out between ranks).
    Rank output is shown while the ranks run (see ``launch.live``; ``live``
    True/False forces it on or off) and relayed in rank order at the end;
    ``quiet=True`` drops it. Ctrl-C (Jupyter's stop button) stops every rank, then
    raises ``LaunchInterrupted`` (a ``KeyboardInterrupt``) saying so.

    Nothing a rank started outlives the call, not even a process in a session of its own
    (see ``launch.procs``). ``leftovers``, a list, receives a ``Leftover(rank, pid, command)``
    for each process that was still running when its rank's code ended or was stopped, and
    which the launch therefore stopped: the exercise checker tells the learner about them.
    """
    __tracebackhide__ = True  # an interrupt's traceback shows the caller's frames (errors.LaunchInterrupted)
    view = None if quiet else choose_view(live)
    spec = LaunchSpec(fn, world_size, tuple(args), backend, timeout, init_process_group, threads or 0,
                      master_addr, live=view is not None)
    try:
        return _launch_once(spec, view, quiet, leftovers)
    except _InitFlake:
        # gloo's connection set-up sometimes fails on a loaded machine before any
        # worker code ran; a fresh attempt on a fresh store is safe.
        return _launch_once(spec, view, quiet, leftovers, retry=False)


class _InitFlake(Exception):
    """Every report came from a failed gloo connection set-up: nothing ran yet."""


def warm_up() -> None:
    """Start the launcher's forkserver now, so that the first ``spawn`` is as quick as the next ones.

    The forkserver imports torch once (seconds); every rank is then forked from it, in
    milliseconds. Notebooks call this before their first timed cell (``00_start_here``,
    ``11_train_end_to_end``), so that no measurement carries the one-off start. Quick when warm.
    """
    __tracebackhide__ = True
    view = choose_view()
    if view is not None and not is_warm():
        view.status("starting the launcher: it imports torch once (a few seconds)...")
    try:
        with children_skip_main():
            process = context().Process(target=no_op, name="warm-up")
            process.start()
        process.join()
    except KeyboardInterrupt:
        interrupted = True  # the forkserver goes on starting; the no-op child it forks ends at once
    else:
        interrupted = False
    finally:
        if view is not None:
            view.close()
    if interrupted:
        raise LaunchInterrupted("warm-up stopped (the launcher finishes starting in the background), "
                                "no rank running")


def _launch_once(spec: LaunchSpec, view: LiveView | None, quiet: bool, leftovers: list[Leftover] | None,
                 retry: bool = True) -> list:
    __tracebackhide__ = True
    import torch.distributed as dist

    # The parent hosts the store on a socket it binds itself: only on master_addr
    # (TCPStore alone would listen on every interface), on a port the kernel picks,
    # so two launches never race for a port.
    listener = socket.create_server((spec.master_addr, 0), backlog=128)
    store = dist.TCPStore(spec.master_addr, listener.getsockname()[1], spec.world_size, is_master=True,
                          timeout=timedelta(seconds=spec.timeout), wait_for_workers=False,
                          master_listen_fd=listener.detach())  # the store owns the socket now
    ctx = context()
    procs: list[mp.process.BaseProcess] = []
    conns: dict[Connection, int] = {}
    readers: list[Connection] = []  # by rank: each rank's last message says what it left running
    left: dict[int, Leftover] = {}  # by pid
    tag = f"{os.getpid()}.{secrets.token_hex(4)}"  # this launch's TAG_ENV, before ":<rank>"
    results: dict[int, Any] = {}
    errors: dict[int, Report] = {}
    interrupted = False
    with tempfile.TemporaryDirectory(prefix="ddp_tutorial_") as tmp:
        outputs = [RankOutput(os.path.join(tmp, f"rank{r}.out")) for r in range(spec.world_size)]
        try:
            if view is not None and not is_warm():
                view.status(f"starting {spec.world_size} rank{'s' * (spec.world_size > 1)} (the first launch "
                            "imports torch once: a few seconds)...")
            # Ctrl-C waits until every rank has started: raised half-way, a rank the
            # forkserver is still forking would be left running, unknown to us.
            with children_skip_main(), interrupts_held_back():
                for rank in range(spec.world_size):
                    recv, send = ctx.Pipe(duplex=False)
                    env = dict(spec.rank_env(rank, store.port), **{TAG_ENV: f"{tag}:{rank}"})
                    p = ctx.Process(target=run_rank, name=f"rank{rank}",
                                    args=(spec, rank, env, outputs[rank].path, send))
                    p.start()
                    send.close()
                    procs.append(p)
                    conns[recv] = rank
                    readers.append(recv)
            _collect(spec, procs, conns, results, errors, outputs, view)
            unfinished = [r for r in range(spec.world_size) if r not in results and r not in errors]
        except KeyboardInterrupt:
            interrupted = True
        finally:
            try:
                stop_ranks(procs, readers, tag, left)
            except KeyboardInterrupt:  # pressed (again) while they were stopped: delivered once they are
                interrupted = True
            if leftovers is not None:
                leftovers.extend(sorted(left.values()))
            del store
            flake = retry and is_init_flake(results, errors)
            if not quiet:
                _show_the_rest(outputs, view)
                if not flake and (view is None or view.relay_at_end):
                    relay(outputs, sys.stdout)
    if interrupted:
        pids = [p.pid for p in procs if p.pid is not None]
        raise LaunchInterrupted(stopped_message(rank_range(range(len(procs))), still_running(pids)))
    if flake:
        raise _InitFlake()
    if errors:
        raise worker_error(errors)
    if unfinished:
        raise WorkerTimeout(unfinished, spec.timeout)
    return [results[r] for r in range(spec.world_size)]


def _collect(spec: LaunchSpec, procs: Sequence[mp.process.BaseProcess], conns: dict[Connection, int],
             results: dict[int, Any], errors: dict[int, Report], outputs: Sequence[RankOutput],
             view: LiveView | None) -> None:
    """Wait for every rank's report (or exit) until the timeout, showing output meanwhile."""
    deadline = time.monotonic() + spec.timeout
    pending = {p.sentinel: r for r, p in enumerate(procs)}
    grace_set = False
    while conns or pending:
        if errors and not grace_set:
            # A short grace, so that the root cause can arrive if a peer's
            # consequential error was reported first; then stop everyone.
            deadline, grace_set = min(deadline, time.monotonic() + 0.5), True
        left = deadline - time.monotonic()
        if left <= 0:
            return
        for ready in wait(list(conns) + list(pending), timeout=min(left, POLL_SECONDS) if view else left):
            if ready in conns:
                rank = conns.pop(ready)
                try:
                    status = pickle.loads(ready.recv_bytes())
                except EOFError:
                    continue  # died before reporting: its sentinel tells
                if status[0] == "ok":
                    results[rank] = status[1]
                elif status[0] == "error":
                    errors[rank] = status[1:]
            elif ready in pending:
                rank = pending.pop(ready)
                if rank not in results and rank not in errors and not _has_message(conns, rank):
                    code = procs[rank].exitcode
                    errors[rank] = (f"process exited with code {code} before returning a result", "", "?")
        if view is not None:
            new = [(rank, line) for rank, output in enumerate(outputs) for line in output.read()]
            view.show(new, {rank: in_progress(o.partial) for rank, o in enumerate(outputs) if o.partial})


def _show_the_rest(outputs: Sequence[RankOutput], view: LiveView | None) -> None:
    """Read what the ranks printed last; a live view shows it (unless the relay will), then goes."""
    new = [(rank, line) for rank, output in enumerate(outputs) for line in output.finish()]
    if view is not None:
        if not view.relay_at_end:
            view.show(new, {})
        view.close()


def _has_message(conns: dict[Connection, int], rank: int) -> bool:
    """True when ``rank`` exited but its result is still waiting in the pipe."""
    for conn, r in conns.items():
        if r == rank and conn.poll():
            return True
    return False
