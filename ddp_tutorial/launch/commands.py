"""Launchers as commands (``torchrun``, the legacy ``torch.distributed.launch``), output captured.

``run_command`` is the one way this package starts such a command: it gets a
timeout, Ctrl-C stops it, and neither leaves a process behind.
"""

from __future__ import annotations

import codecs
import io
import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ddp_tutorial.launch.errors import LaunchInterrupted, stopped_message
from ddp_tutorial.launch.live import LiveView, choose_view
from ddp_tutorial.launch.procs import descendants, interrupts_held_back, signal_group, still_running
from ddp_tutorial.launch.spec import LOCALHOST, PLAIN_TEXT, free_port

OnLine = Callable[[str, subprocess.Popen], None]
STATUS_SECONDS, STATUS_WIDTH = 0.1, 120  # torchrun's status line: how often it changes, how long it gets


@dataclass
class TorchrunResult:
    """What a launcher returned: its exit code and everything it and its workers printed."""

    returncode: int
    output: str

    def __str__(self) -> str:
        return self.output


class TorchrunError(RuntimeError):
    """torchrun exited non-zero; ``result`` holds the exit code and the whole output."""

    def __init__(self, result: TorchrunResult, command: Sequence[str]):
        self.result = result
        super().__init__(f"torchrun exited with code {result.returncode}: {' '.join(command)}\n"
                         f"--- output ---\n{result.output.rstrip()}")


# options that name the rendezvous: with none of them, torchrun_command picks a free port on 127.0.0.1
RENDEZVOUS_KEYS = {"standalone", "nnodes", "rdzv_endpoint", "master_port", "master_addr", "rdzv_backend"}
# what torchrun's store says when its port is taken (torch 2.9-2.15: "... name: EADDRINUSE, ...")
PORT_TAKEN = "EADDRINUSE"

def torchrun_command(module: str, nproc_per_node: int = 2, args: Sequence[Any] = (),
                     **opts: Any) -> list[str]:
    """The ``torchrun`` command line for ``module``; ``opts`` become ``--key=value``.

    Without rendezvous options it is one node meeting at 127.0.0.1 on a free port
    (``--master-addr``/``--master-port``: torch's static rendezvous), not ``--standalone``:
    both leave the agent's store listening on every interface (torch gives no way to bind
    it to loopback), but the static one opens that one socket instead of two, and its agent
    never unpickles what it reads there (lesson 09, section 1).
    """
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc_per_node}"]
    if not RENDEZVOUS_KEYS & set(opts):
        # a port 0 would reach the workers as MASTER_PORT=0: the number must be known up front
        cmd += [f"--master-addr={LOCALHOST}", f"--master-port={free_port()}"]
    for key, value in opts.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            cmd.append(flag)
        elif value is not False and value is not None:  # not `in (False, None)`: 0 == False
            cmd.append(f"{flag}={value}")
    return cmd + ["-m", module] + [str(a) for a in args]


def as_shell(cmd: Sequence[str]) -> str:
    """``cmd`` as a person types it (lessons 09, 11): ``torchrun`` for ``python -m torch.distributed.run``,
    and the free port ``torchrun_command`` chose as ``$PORT`` (it differs from run to run)."""
    if list(cmd[1:3]) == ["-m", "torch.distributed.run"]:
        cmd = ["torchrun", *cmd[3:]]
    return " ".join("--master-port=$PORT" if part.startswith("--master-port=") and part[14:].isdigit() else part
                    for part in cmd)


def torchrun(module: str, nproc_per_node: int = 2, args: Sequence[Any] = (), *,
             timeout: float = 300.0, check: bool = True, env: dict | None = None,
             threads: int | None = None, on_line: OnLine | None = None, **opts: Any) -> TorchrunResult:
    """Run ``torchrun ... -m module args`` and return its exit code and output.

    Each worker uses ``threads`` threads (``OMP_NUM_THREADS``; default: the
    caller's setting, else 1, as torchrun itself does). ``on_line(line, proc)``
    sees each line as it arrives, with the torchrun process (to signal it, say).
    Raises ``TorchrunError`` (with the whole output) on a non-zero exit when
    ``check`` is true, ``TimeoutError`` after ``timeout`` seconds, and
    ``LaunchInterrupted`` on Ctrl-C; either way torchrun and all its workers are
    gone when this returns. Until it ends, a person watching (Jupyter, a terminal)
    sees one status line: what is starting, then torchrun's latest line.
    """
    __tracebackhide__ = True  # an interrupt's traceback shows the caller's frames (errors.LaunchInterrupted)
    cmd = torchrun_command(module, nproc_per_node, args, **opts)
    run_env = dict(os.environ if env is None else env)
    if threads is not None:
        run_env["OMP_NUM_THREADS"] = str(threads)
    run_env.setdefault("OMP_NUM_THREADS", "1")  # set, so that torchrun need not warn that it sets it
    # Silent otherwise: torchrun and every worker import torch first (seconds).
    status = f"starting torchrun with {nproc_per_node} processes (each imports torch: a few seconds)..."
    result = run_command(cmd, timeout=timeout, env=run_env, name="torchrun", on_line=on_line, status=status)
    if result.returncode != 0 and PORT_TAKEN in result.output and not RENDEZVOUS_KEYS & set(opts):
        # The free port this call chose was taken (by any process) before torchrun's store bound it:
        # choose again, once. A port the caller named is the caller's to change.
        cmd = torchrun_command(module, nproc_per_node, args, **opts)
        result = run_command(cmd, timeout=timeout, env=run_env, name="torchrun", on_line=on_line, status=status)
    if check and result.returncode != 0:
        raise TorchrunError(result, cmd)
    return result


def _also_shown(view: LiveView, name: str, on_line: OnLine | None) -> OnLine:
    """``on_line``, and the view's status line showing the latest line (ten times a second at most)."""
    shown_at = [0.0]

    def both(line: str, proc: subprocess.Popen) -> None:
        if line.strip() and time.monotonic() - shown_at[0] >= STATUS_SECONDS:
            view.status(f"{name}: {line.strip()}"[:STATUS_WIDTH])
            shown_at[0] = time.monotonic()
        if on_line is not None:
            on_line(line, proc)
    return both


def run_command(cmd: Sequence[str], *, timeout: float, env: dict | None = None, name: str = "",
                on_line: OnLine | None = None, status: str | None = None, cwd: str | None = None) -> TorchrunResult:
    """Run ``cmd`` (a launcher) with its output captured; stop it and all it started on a timeout or Ctrl-C.

    The command runs in a session of its own, unbuffered (``PYTHONUNBUFFERED``), so
    lines arrive as they are printed. ``TimeoutError`` after ``timeout`` seconds,
    with the output so far; ``name`` names the command in that message. Ctrl-C:
    ``LaunchInterrupted``, once the command and what it started are stopped. With a
    ``status``, a person watching (Jupyter, a terminal) sees it as one line until the first
    output, then the command's latest line; stored output (nbconvert, nbval) never has it.
    """
    __tracebackhide__ = True
    name = name or os.path.basename(cmd[0])
    view = choose_view() if status else None
    if view is not None:
        view.status(status)
        on_line = _also_shown(view, name, on_line)
    try:
        return _run(cmd, timeout, env, name, on_line, cwd)
    finally:
        if view is not None:
            view.close()


def _run(cmd: Sequence[str], timeout: float, env: dict | None, name: str, on_line: OnLine | None,
         cwd: str | None = None) -> TorchrunResult:
    """``run_command`` without the status line."""
    __tracebackhide__ = True
    run_env = dict(os.environ if env is None else env, PYTHONUNBUFFERED="1", **PLAIN_TEXT)
    proc = subprocess.Popen(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=run_env,
                            start_new_session=True, cwd=cwd)
    reader = _Lines(proc, on_line)
    deadline = time.monotonic() + timeout
    try:
        if not reader.read_until_closed(deadline):
            raise subprocess.TimeoutExpired(cmd, timeout)
        proc.wait(max(0.0, deadline - time.monotonic()))
    except BaseException as exc:  # the timeout, or Ctrl-C
        interrupted = isinstance(exc, KeyboardInterrupt)
        try:
            with interrupts_held_back():  # pressed again meanwhile: only once everything is stopped
                # Ctrl-C: a person waits, so a short grace (torchrun's workers may take seconds to
                # wind down after its SIGTERM); a timeout: time for torchrun to stop them itself.
                started = _stop(proc, grace=1.0 if interrupted else 5.0)
        except KeyboardInterrupt:  # the one held back, now that everything is stopped
            interrupted = True
        if interrupted:
            what = f"{name} and the {len(started)} processes it started"
            pids = [proc.pid, *started]
            raise LaunchInterrupted(stopped_message(what, still_running(pids))) from None
        if not isinstance(exc, subprocess.TimeoutExpired):
            raise
        reader.read_until_closed(time.monotonic() + 10.0)  # the rest, unless something unknown holds the pipe
        raise TimeoutError(f"{name} did not finish within {timeout:g} s: "
                           f"{' '.join(cmd)}\n--- output ---\n{reader.text()}") from None
    finally:
        signal_group(proc.pid, signal.SIGKILL, leader_too=False)  # what is left in its group
        proc.stdout.close()
    return TorchrunResult(proc.returncode, reader.text())


class _Lines:
    """A command's output as it arrives: kept whole, and handed line by line to ``on_line``."""

    def __init__(self, proc: subprocess.Popen, on_line: OnLine | None):
        self._proc, self._on_line = proc, on_line
        # As text=True would decode it: UTF-8 (errors replaced) with "\r\n" and "\r" made "\n".
        self._decoder = io.IncrementalNewlineDecoder(codecs.getincrementaldecoder("utf-8")("replace"), True)
        self._chunks: list[str] = []
        self._partial = ""
        self._closed = False

    def read_until_closed(self, deadline: float) -> bool:
        """Read until every writer closed the pipe (True) or ``deadline`` passed (False)."""
        fd = self._proc.stdout.fileno()
        with selectors.DefaultSelector() as selector:
            selector.register(fd, selectors.EVENT_READ)
            while not self._closed:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                if selector.select(left):
                    data = os.read(fd, 65536)
                    self._closed = not data
                    self._take(self._decoder.decode(data, final=self._closed))
        return True

    def _take(self, text: str) -> None:
        self._chunks.append(text)
        if self._on_line is None:
            return
        *lines, self._partial = (self._partial + text).split("\n")
        if self._closed and self._partial:
            lines.append(self._partial)
        for line in lines:
            self._on_line(line, self._proc)

    def text(self) -> str:
        return "".join(self._chunks)


def _stop(proc: subprocess.Popen, grace: float = 5.0) -> list[int]:
    """Stop the launcher and every process it started; return the pids of the latter.

    torchrun starts each worker in a session of its own, so killing torchrun's
    process group would leave the workers running (and holding the output pipe
    open). Asked with SIGTERM, torchrun stops its workers itself; whatever is
    still there after ``grace`` seconds is killed.
    """
    started = descendants(proc.pid)  # now: once torchrun is gone they have another parent
    signal_group(proc.pid, signal.SIGTERM, leader_too=False)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        pass
    signal_group(proc.pid, signal.SIGKILL, leader_too=False)
    for pid in started:  # each worker leads a process group: it and what it started
        signal_group(pid, signal.SIGKILL)
    return started
