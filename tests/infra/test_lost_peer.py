"""A peer's death ends a command line with one line per surviving rank, not gloo's traceback (issue 38)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ddp_tutorial.launch import free_port
from ddp_tutorial.launch.errors import exit_on_interrupt

# what gloo 2.15 raised in a rank whose peer was SIGKILLed mid all-reduce (seen, trimmed)
GLOO_RESET = ("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:545] Read error "
              "[127.0.0.1]:25475: Connection reset by peer. This is typically caused by a remote worker hanging")


def test_a_lost_peer_is_one_line_naming_the_rank_and_exit_1(monkeypatch, capsys):
    monkeypatch.setenv("RANK", "3")
    with pytest.raises(SystemExit) as ended, exit_on_interrupt("prog", "nothing was saved"):
        raise RuntimeError(GLOO_RESET)
    assert ended.value.code == 1
    said = capsys.readouterr().err.strip().splitlines()
    assert said == ["prog: rank 3 lost a peer (Connection reset by peer): another rank stopped or crashed, and its "
                    "own output says why; under torchrun the agent stops the others for you"]


def test_any_other_error_is_left_alone(capsys):
    with pytest.raises(RuntimeError, match="shape mismatch"), exit_on_interrupt("prog", "nothing was saved"):
        raise RuntimeError("shape mismatch")
    assert capsys.readouterr().err == ""


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_ranks_started_by_hand_whose_peer_is_killed_say_one_line():
    port, procs = free_port(), []
    for rank in range(2):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, "-m", "ddp_tutorial.training.train", "--epochs", "500"],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env))
    try:
        for line in procs[0].stdout:
            if line.startswith("epoch 1/500"):  # both ranks are training: the next all-reduce needs rank 1
                break
        procs[1].kill()
        _, err = procs[0].communicate(timeout=150)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
    assert procs[0].returncode == 1, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ddp_tutorial.training.train: rank 0 lost a peer ("), err
