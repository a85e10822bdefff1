"""``launch.spawn``: start the ranks, collect their results and output, stop them all."""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import signal
import socket
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from datetime import timedelta
from multiprocessing.connection import wait
from typing import Any, Callable, Iterator, Sequence

from ddp_tutorial.launch._child import _child, _children_skip_main, _context

LOCALHOST = "127.0.0.1"


class WorkerError(RuntimeError):
    """A rank raised (or died). ``rank`` is the first failing rank, ``remote_traceback`` its traceback."""

    def __init__(self, rank: int, message: str, remote_traceback: str = ""):
        self.rank = rank
        self.remote_traceback = remote_traceback
        text = f"rank {rank} failed: {message}"
        if remote_traceback:
            text += f"\n\n--- traceback from rank {rank} ---\n{remote_traceback.rstrip()}"
        super().__init__(text)


class WorkerTimeout(WorkerError, TimeoutError):
    """Ranks were still running when the timeout ran out. ``ranks`` lists them."""

    def __init__(self, ranks: Sequence[int], timeout: float):
        self.ranks = list(ranks)
        RuntimeError.__init__(
            self, f"timed out after {timeout:g} s; ranks still running: {self.ranks} "
            "(a hang: a collective some rank never reached, or a deadlock in send/recv)")
        self.rank = self.ranks[0]
        self.remote_traceback = ""


def free_port(host: str = LOCALHOST) -> int:
    """A port that was free a moment ago (for tools that need a number up front)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _check_target(fn: Callable) -> None:
    if not callable(fn):
        raise TypeError(f"spawn() needs a function to run on every rank, got {type(fn).__name__}: {fn!r}")
    module = getattr(fn, "__module__", None)
    qualname = getattr(fn, "__qualname__", getattr(fn, "__name__", repr(fn)))
    if module == "__main__":
        raise ValueError(
            f"the worker {qualname!r} is defined in __main__ (a notebook or a script run directly); "
            "child processes cannot import it. Move it into a module (for example "
            "ddp_tutorial/my_lesson.py) and import it from there.")
    if "<locals>" in qualname or "<lambda>" in qualname:
        raise ValueError(f"the worker {qualname!r} is a lambda or nested function, which cannot be "
                         "pickled; define it at the top level of a module.")


def _stop(procs: Sequence[mp.process.BaseProcess]) -> None:
    """Stop every child and everything it started; wait until they are gone.

    A Ctrl-C meanwhile (the user pressing it again) waits until they are: raised
    half-way, it would leave ranks running.
    """
    with _interrupts_held_back():
        for sig, grace in ((signal.SIGTERM, 1.0), (signal.SIGKILL, 5.0)):
            for p in procs:
                if p.pid is None:
                    continue
                for kill in (lambda: os.killpg(p.pid, sig), lambda: os.kill(p.pid, sig)):
                    try:
                        kill()
                    except (ProcessLookupError, PermissionError):
                        pass
            deadline = time.monotonic() + grace
            for p in procs:
                p.join(max(0.0, deadline - time.monotonic()))
            if not any(p.is_alive() for p in procs):
                break


@contextmanager
def _interrupts_held_back() -> Iterator[None]:
    """Hold SIGINT back inside the block and deliver it afterwards, to whatever handles it."""
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


def _relay(out_paths: Sequence[str], stream) -> None:
    for rank, path in enumerate(out_paths):
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                text = f.read()
        except FileNotFoundError:
            continue
        for line in text.splitlines():
            if _is_noise(line):
                continue
            print(f"[rank {rank}] {line}", file=stream)
    stream.flush()


def _is_noise(line: str) -> bool:
    # gloo's own start-up chatter would make notebook output depend on timing
    return line.startswith("[Gloo] Rank ") and "connected to" in line


def spawn(fn: Callable[..., Any], world_size: int = 2, args: Sequence[Any] = (), *,
          backend: str | None = None, timeout: float = 60.0, init_process_group: bool = True,
          threads: int | None = None, master_addr: str = LOCALHOST, quiet: bool = False) -> list:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` processes; return results by rank.

    ``init_process_group=True`` sets up the default group (``backend`` or the
    best available, see ``ddp_tutorial.env.choose_backend``) before ``fn`` and
    destroys it afterwards. With ``False`` only ``MASTER_ADDR``/``MASTER_PORT``
    are set and ``fn`` calls ``dist.init_process_group`` itself. Each rank uses
    ``threads`` torch threads (default: the cores shared out between ranks).
    ``quiet=True`` drops the relayed output.
    """
    _check_target(fn)
    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        raise ValueError(f"world_size must be a whole number >= 1, got {world_size!r}")
    if timeout <= 0:
        raise ValueError(f"timeout must be positive, got {timeout!r}")
    threads = threads or max(1, (os.cpu_count() or 1) // world_size)
    launch = (fn, world_size, tuple(args), backend, timeout, init_process_group, threads, master_addr, quiet)
    try:
        return _launch_once(*launch)
    except _InitFlake:
        # gloo's connection set-up sometimes fails on a loaded machine before any
        # worker code ran; a fresh attempt on a fresh store is safe.
        return _launch_once(*launch, retry=False)


class _InitFlake(Exception):
    """Every report came from a failed gloo connection set-up: nothing ran yet."""


def _is_init_flake(results: dict, errors: dict) -> bool:
    return bool(errors) and not results and all(
        stage == "init" and "connectFullMesh" in message for message, _, stage in errors.values())


def _launch_once(fn, world_size, args, backend, timeout, init_process_group, threads, master_addr,
                 quiet, retry=True) -> list:
    import torch.distributed as dist

    # The parent hosts the store on a socket it binds itself: only on master_addr
    # (TCPStore alone would listen on every interface), on a port the kernel picks,
    # so two launches never race for a port.
    listener = socket.create_server((master_addr, 0), backlog=128)
    store = dist.TCPStore(master_addr, listener.getsockname()[1], world_size, is_master=True,
                          timeout=timedelta(seconds=timeout), wait_for_workers=False,
                          master_listen_fd=listener.detach())  # the store owns the socket now
    env = dict(os.environ, MASTER_ADDR=master_addr, MASTER_PORT=str(store.port),
               WORLD_SIZE=str(world_size), TORCHELASTIC_USE_AGENT_STORE="True",
               OMP_NUM_THREADS=str(threads))
    ctx = _context()
    procs, conns, results, errors = [], {}, {}, {}
    with tempfile.TemporaryDirectory(prefix="ddp_tutorial_") as tmp:
        out_paths = [os.path.join(tmp, f"rank{r}.out") for r in range(world_size)]
        try:
            with _children_skip_main():
                for rank in range(world_size):
                    recv, send = ctx.Pipe(duplex=False)
                    rank_env = dict(env, RANK=str(rank), LOCAL_RANK=str(rank),
                                    LOCAL_WORLD_SIZE=str(world_size))
                    p = ctx.Process(target=_child, name=f"rank{rank}",
                                    args=(fn, rank, world_size, args, backend, init_process_group,
                                          rank_env, out_paths[rank], send, threads, timeout))
                    p.start()
                    send.close()
                    procs.append(p)
                    conns[recv] = rank
            deadline = time.monotonic() + timeout
            pending = {p.sentinel: r for r, p in enumerate(procs)}
            grace_set = False
            while conns or pending:
                if errors and not grace_set:
                    # A short grace, so that the root cause can arrive if a peer's
                    # consequential error was reported first; then stop everyone.
                    deadline, grace_set = min(deadline, time.monotonic() + 0.5), True
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                for ready in wait(list(conns) + list(pending), timeout=left):
                    if ready in conns:
                        rank = conns.pop(ready)
                        try:
                            status = pickle.loads(ready.recv_bytes())
                        except EOFError:
                            continue  # died before reporting: its sentinel tells
                        if status[0] == "ok":
                            results[rank] = status[1]
                        else:
                            errors[rank] = status[1:]
                    elif ready in pending:
                        rank = pending.pop(ready)
                        if rank not in results and rank not in errors and not _has_message(conns, rank):
                            code = procs[rank].exitcode
                            errors[rank] = (f"process exited with code {code} before returning a result", "", "?")
            still_running = [r for r in range(world_size) if r not in results and r not in errors]
        finally:
            _stop(procs)
            for c in conns:
                c.close()
            del store
            flake = retry and _is_init_flake(results, errors)
            if not quiet and not flake:
                _relay(out_paths, sys.stdout)
    if flake:
        raise _InitFlake()
    if errors:
        rank = _root_cause(errors)
        message, remote_tb, _ = errors[rank]
        others = sorted(set(errors) - {rank})
        if others:
            message += f" (ranks {others} failed too, probably as a consequence)"
        raise WorkerError(rank, message, remote_tb)
    if still_running:
        raise WorkerTimeout(still_running, timeout)
    return [results[r] for r in range(world_size)]


# Errors a rank gets because a *peer* failed: not the cause.
_PEER_FAILURE = ("Connection closed by peer", "Connection reset by peer", "Broken pipe",
                 "remote worker crashing", "NCCL communicator was aborted")


def _root_cause(errors: dict) -> int:
    """The rank whose error is the cause: the first reported one that is not a peer failure."""
    for rank in errors:  # dicts keep arrival order
        if not any(marker in errors[rank][0] for marker in _PEER_FAILURE):
            return rank
    return next(iter(errors))


def _has_message(conns: dict, rank: int) -> bool:
    """True when ``rank`` exited but its result is still waiting in the pipe."""
    for conn, r in conns.items():
        if r == rank and conn.poll():
            return True
    return False
