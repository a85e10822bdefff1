"""The command lines' bad inputs as a user meets them: real processes, one line each (issue 38).

``bad_inputs.CASES`` is the table (``ddp_tutorial.training.train``, ``exercises check``, ``bench``,
``capstone.composed``, ``tensor_parallel.split_mlp``); this file runs it, and Ctrl-C and torchrun,
under ``make test-slow``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import bad_inputs
import pytest

from ddp_tutorial.launch import torchrun

pytestmark = pytest.mark.slow
COMMAND = [sys.executable, "-m", "ddp_tutorial.training.train"]
# Ctrl-C, delivered for real (SIGINT to the process itself) once the ranks' group is up: no timing involved.
INTERRUPTED_IN_TRAINING = """
import os, signal, sys, time
from ddp_tutorial.capstone import composed

def interrupted(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(60)

composed.composed_worker = interrupted
composed.main(sys.argv[1:])
"""


@pytest.mark.timeout(300)  # a torch import alone took 30-90 s on 2 cores shared by 7 test runs
@pytest.mark.parametrize("case", bad_inputs.CASES, ids=[case.name for case in bad_inputs.CASES])
def test_a_bad_input_is_one_line_and_its_exit_code(case, tmp_path):
    if case.skip:
        pytest.skip(case.skip)
    if case.nproc:
        # Every rank finds the fault; local rank 0 alone says it, before the ranks meet.
        run = torchrun(case.command[0], case.nproc, args=[*case.command[1:], *case.args(tmp_path)], check=False,
                       timeout=240)
        assert run.returncode != 0, run.output
        assert run.output.count(case.says) == 1, run.output
        assert "ddp_tutorial/" not in run.output, run.output  # no traceback through the course's code
        return
    done = subprocess.run([sys.executable, "-m", *case.command, *case.args(tmp_path)], capture_output=True, text=True,
                          timeout=280, env=dict(os.environ, OMP_NUM_THREADS="1"))
    said = done.stderr.strip().splitlines()
    assert done.returncode == case.code, done.stderr
    assert len(said) == 1 and case.says in said[0], done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    if case.command == bad_inputs.TRAIN:
        assert "epoch 1/" not in done.stdout  # refused before any training
    else:
        assert done.stdout == ""  # refused before any work: no result, no benchmark table, no verdict


def _session_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def ctrl_c_as_in_a_terminal() -> None:
    # Run in the background (`make test-slow &`, nohup, some CI runners), the tests inherit SIGINT
    # ignored, and so would the command: Python then never raises KeyboardInterrupt. A terminal's
    # foreground program has the default, which is what these tests are about.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def interrupted_at(prefix: str, command: list[str], *,
                   stderr: int = subprocess.STDOUT) -> tuple[subprocess.Popen, str, str | None]:
    """Run ``command`` in a session of its own; once a line starts with ``prefix``, SIGINT the session,
    as a terminal's Ctrl-C does. Returns the process, everything it printed on stdout, and its stderr."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr, text=True, start_new_session=True,
                               env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1"),  # lines as they come
                               preexec_fn=ctrl_c_as_in_a_terminal)
    lines = []
    try:
        for line in process.stdout:
            lines.append(line)
            if line.startswith(prefix):
                break
        os.killpg(process.pid, signal.SIGINT)
        rest, err = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    return process, "".join(lines) + rest, err


@pytest.mark.timeout(180)
def test_ctrl_c_is_one_line_exit_130_and_nothing_left_running(tmp_path):
    # As a terminal does it: SIGINT to the whole foreground group, the DataLoader workers included.
    process, _, err = interrupted_at("epoch 1/500",  # training, with a checkpoint written
                                     [*COMMAND, "--epochs", "500", "--workers", "1", "--checkpoint",
                                      str(tmp_path / "c.pt")], stderr=subprocess.PIPE)
    assert process.returncode == 130, err
    assert err.strip().splitlines() == [f"ddp_tutorial.training.train: interrupted: the last checkpoint is "
                                        f"{tmp_path / 'c.pt'}; add --resume to continue from it"], err
    deadline = time.monotonic() + 30
    while _session_alive(process.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _session_alive(process.pid), "a DataLoader worker outlived the interrupted run"


@pytest.mark.timeout(150)
def test_under_torchrun_a_bad_option_is_said_once_before_the_ranks_meet():
    run = torchrun("ddp_tutorial.training.train", 2, args=["--stop-on-signal", "KILL", "--checkpoint", "c.pt"],
                   check=False, timeout=120)
    assert run.returncode != 0
    assert run.output.count("SIGKILL cannot be caught") == 1, run.output
    assert "ddp_tutorial/training/" not in run.output, run.output  # no traceback through the course's code


@pytest.mark.timeout(150)
def test_ctrl_c_on_capstone_composed_is_one_line_and_exit_130():
    done = subprocess.run([sys.executable, "-c", INTERRUPTED_IN_TRAINING, "--steps", "2"], capture_output=True,
                          text=True, timeout=140, env=dict(os.environ, OMP_NUM_THREADS="1"),
                          preexec_fn=ctrl_c_as_in_a_terminal)
    assert done.returncode == 130, done.stderr
    assert done.stderr.strip().splitlines() == ["python -m ddp_tutorial.capstone.composed: interrupted: nothing was "
                                                "saved; run it again"], done.stderr


@pytest.mark.timeout(200)
def test_ctrl_c_under_torchrun_is_one_course_line_then_torchruns_own_account():
    # As lesson 09 says: the terminal's SIGINT reaches torchrun's agent (its workers run in sessions
    # of their own), which forwards it; local rank 0 says the one line, the agent its SignalException.
    from ddp_tutorial.launch import torchrun_command
    process, output, _ = interrupted_at("epoch 1/500", torchrun_command("ddp_tutorial.training.train", 2,
                                                                       ["--epochs", "500"]))
    assert process.returncode == 1, output  # torchrun's own exit code after a signal
    assert output.count("ddp_tutorial.training.train: interrupted: no checkpoint was saved") == 1, output
    assert "ddp_tutorial/" not in output, output  # no traceback through the course's code
    assert output.count("Traceback") == 1 and "SignalException: Process" in output, output
    assert output.rstrip().endswith("got signal: 2"), output
