"""``launch.torchrun``: run the real torchrun from a notebook or a test, output captured."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from typing import Any, Sequence

from ddp_tutorial.launch._spawn import _interrupts_held_back
from ddp_tutorial.launch.procs import descendants


@dataclass
class TorchrunResult:
    """What ``torchrun`` returned: its exit code and everything it and its workers printed."""

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


def torchrun_command(module: str, nproc_per_node: int = 2, args: Sequence[Any] = (),
                     **opts: Any) -> list[str]:
    """The ``torchrun`` command line for ``module``; ``opts`` become ``--key=value``.

    Without rendezvous options it adds ``--standalone`` (one node, a free port on
    localhost chosen by torchrun itself).
    """
    rdzv_keys = {"standalone", "nnodes", "rdzv_endpoint", "master_port", "master_addr", "rdzv_backend"}
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc_per_node}"]
    if not rdzv_keys & set(opts):
        cmd.append("--standalone")
    for key, value in opts.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            cmd.append(flag)
        elif value not in (False, None):
            cmd.append(f"{flag}={value}")
    return cmd + ["-m", module] + [str(a) for a in args]


def torchrun(module: str, nproc_per_node: int = 2, args: Sequence[Any] = (), *,
             timeout: float = 300.0, check: bool = True, env: dict | None = None,
             **opts: Any) -> TorchrunResult:
    """Run ``torchrun ... -m module args`` and return its exit code and output.

    Raises ``TorchrunError`` (with the whole output) on a non-zero exit when
    ``check`` is true, and ``TimeoutError`` after ``timeout`` seconds; either way
    torchrun and all its workers are gone when this returns.
    """
    cmd = torchrun_command(module, nproc_per_node, args, **opts)
    run_env = dict(os.environ if env is None else env)
    run_env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc_per_node)))
    run_env["PYTHONUNBUFFERED"] = "1"
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=run_env, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout)
    except BaseException as exc:  # the timeout, or Ctrl-C
        with _interrupts_held_back():  # pressed again meanwhile: only once everything is stopped
            _stop(proc)
        output = _rest_of_output(proc)
        if not isinstance(exc, subprocess.TimeoutExpired):
            raise
        raise TimeoutError(f"torchrun did not finish within {timeout:g} s: {' '.join(cmd)}\n"
                           f"--- output ---\n{output}") from None
    finally:
        _kill_group(proc)
    result = TorchrunResult(proc.returncode, output)
    if check and proc.returncode != 0:
        raise TorchrunError(result, cmd)
    return result


def _stop(proc: subprocess.Popen, grace: float = 5.0) -> None:
    """Stop torchrun and every process it started.

    torchrun starts each worker in a session of its own, so killing torchrun's
    process group would leave the workers running (and holding the output pipe
    open). Asked with SIGTERM, torchrun stops its workers itself; whatever is
    still there after ``grace`` seconds is killed.
    """
    started = descendants(proc.pid)  # now: once torchrun is gone they have another parent
    _kill_group(proc, signal.SIGTERM)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        pass
    _kill_group(proc)
    for pid in started:  # each worker leads a process group: it and what it started
        for kill in (os.killpg, os.kill):
            try:
                kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def _kill_group(proc: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
    """Signal torchrun's process group (torchrun, unless it has exited, and what it started there)."""
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _rest_of_output(proc: subprocess.Popen, wait: float = 10.0) -> str:
    """What torchrun printed; if something unknown still holds the pipe, what it printed so far."""
    try:
        return proc.communicate(timeout=wait)[0]
    except subprocess.TimeoutExpired as exc:
        proc.stdout.close()
        proc.wait()
        return (exc.output or b"").decode(errors="replace")
