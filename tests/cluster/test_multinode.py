"""ddp_tutorial.cluster.multinode's launchers go through launch: results as before, a timeout, no process left behind."""

from __future__ import annotations

import os
import re
import signal
import time
import uuid
from pathlib import Path

import pytest

from ddp_tutorial.cluster import multinode

pytestmark = [pytest.mark.timeout(180),
              pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="reads /proc")]

# Prints a numbered line every 0.2 s for a minute: long enough to be stopped or timed out.
_COUNTING_MODULE = """
import os, sys, time
for step in range(300):
    print(f"rank {os.environ['RANK']} step {step}", flush=True)
    time.sleep(0.2)
"""


@pytest.fixture
def counting_module(tmp_path, monkeypatch):
    """A module the launchers can run (PYTHONPATH), named uniquely to find its processes; none survive the test."""
    module = f"count_{uuid.uuid4().hex}"
    (tmp_path / f"{module}.py").write_text(_COUNTING_MODULE)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    yield module
    for pid in processes_mentioning(module):
        os.kill(pid, signal.SIGKILL)


def processes_mentioning(marker: str) -> list[int]:
    """Live (not zombie) processes whose command line contains ``marker``."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker in cmdline and state != "Z" and int(proc.name) != os.getpid():
            found.append(int(proc.name))
    return found


def assert_none_left(marker: str, within: float = 5.0) -> None:
    deadline = time.monotonic() + within
    while processes_mentioning(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not processes_mentioning(marker), "the launcher or its workers outlived the call"


@pytest.mark.slow  # make test stays under 12 minutes; make test-slow and CI run it
def test_legacy_launch_passes_local_rank_and_returns_the_output():
    result = multinode.legacy_launch("ddp_tutorial.cluster.multinode", nproc_per_node=2, timeout=120)
    assert result.returncode == 0, result.output
    assert "FutureWarning" in result.output and "torch.distributed.launch is deprecated" in result.output
    reports = multinode.parse_reports(result.output)
    assert [(r["RANK"], r["local_rank_arg"], r["local_rank_used"]) for r in reports] == [("0", 0, 0), ("1", 1, 1)]


def last_step(output: str, rank: int) -> int:
    """The last step ``rank`` of the counting module printed (-1: none)."""
    return max((int(step) for step in re.findall(rf"^rank {rank} step (\d+)$", output, re.M)), default=-1)


@pytest.mark.slow  # make test stays under 12 minutes; make test-slow and CI run it
def test_legacy_launch_times_out_with_the_output_and_leaves_no_process(counting_module):
    with pytest.raises(TimeoutError) as info:
        multinode.legacy_launch(counting_module, nproc_per_node=2, timeout=20)
    message = str(info.value)
    assert "torch.distributed.launch did not finish within 20 s" in message
    assert "rank 0 step 1" in message and "rank 1 step 1" in message
    # Order, not time: the timeout stopped the workers before their own end (step 299, a minute at the least)
    # and nothing ran on after it.
    assert 1 <= last_step(message, 0) < 299 and 1 <= last_step(message, 1) < 299, message
    assert_none_left(counting_module)


def test_run_and_stop_signals_the_agent_once_the_line_appears(counting_module):
    result = multinode.run_and_stop(counting_module, [], stop_when="rank 0 step 5", sig=signal.SIGTERM, timeout=60)
    assert result.returncode != 0  # a job that ran to its own end exits 0
    # Order, not time: the stop line came, then the signal, then the end; the workers never reached their own
    # last step (299, a minute at the least), however slowly the signal travelled on a loaded machine.
    assert 5 <= last_step(result.output, 0) < 299 and last_step(result.output, 1) < 299, result.output
    # the agent got it (its log line, or on torch 2.9-2.10 only its SignalException) and stopped its workers
    assert "Received 15 death signal" in result.output or "got signal: 15" in result.output, result.output
    assert_none_left(counting_module)


@pytest.mark.slow  # make test stays under 12 minutes; make test-slow and CI run it
def test_run_and_stop_times_out_when_the_line_never_appears(counting_module):
    with pytest.raises(TimeoutError, match="torchrun did not finish within 6 s"):
        multinode.run_and_stop(counting_module, [], stop_when="never printed", timeout=6)
    assert_none_left(counting_module)


def test_each_simulated_node_sees_only_its_own_gpus():
    from ddp_tutorial.cluster.multinode import node_visible_devices as see
    assert [see(k, 2, 2, cuda_devices=4) for k in range(2)] == ["0,1", "2,3"]
    assert [see(k, 2, 2, cuda_devices=8) for k in range(2)] == ["0,1", "2,3"]
    # too few GPUs for 2 nodes x 2 ranks: hide them all, every node uses gloo on the CPU
    assert [see(k, 2, 2, cuda_devices=n) for n in (0, 1, 3) for k in range(2)] == [""] * 6
    # the caller already restricted the GPUs: indices count inside that list
    assert [see(k, 2, 2, cuda_devices=4, visible="4,5,6,7") for k in range(2)] == ["4,5", "6,7"]


def test_legacy_launch_shows_a_status_while_the_launcher_starts(monkeypatch):
    seen = {}

    def fake_run_command(cmd, **kwargs):
        seen.update(kwargs, cmd=cmd)
        return multinode.TorchrunResult(0, "")

    monkeypatch.setattr(multinode, "run_command", fake_run_command)
    multinode.legacy_launch("ddp_tutorial.cluster.multinode", nproc_per_node=3)
    assert seen["status"] == "starting torch.distributed.launch with 3 processes..."
    assert "torch.distributed.launch" in seen["cmd"] and "--nproc-per-node=3" in seen["cmd"]
