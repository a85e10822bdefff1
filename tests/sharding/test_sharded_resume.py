"""Crash and restart under torchrun, resumed from a DCP checkpoint (``ddp_tutorial.sharding.sharded_resume``)."""

from __future__ import annotations

import os

import pytest

from ddp_tutorial.launch import spawn, torchrun
from ddp_tutorial.sharding.sharded_resume import latest_step, train_with_checkpoints


@pytest.mark.timeout(180)
def test_a_crash_resumes_to_the_uninterrupted_weights(tmp_path):
    folder = tmp_path / "restarted"
    # async saves: at the crash (step 3) the save of step 3 may be unfinished, so the restart takes step 2's
    run = torchrun("ddp_tutorial.sharding.sharded_resume", 2,
                   args=["--checkpoint-dir", folder, "--steps", "5", "--fail-at-step", "3", "--async-save"],
                   max_restarts=1, timeout=150, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert "rank 1: injected failure at step 3" in run.output
    assert "attempt 1: trained from step 2 to step 5" in run.output, run.output
    assert latest_step(str(folder)) == 5
    # the reference: one uninterrupted run with blocking saves, one thread per rank as torchrun's
    reference = spawn(train_with_checkpoints, 2, args=(str(tmp_path / "straight"), 5), threads=1, timeout=100)
    assert reference[0]["resumed from"] is None
    assert f"weights {reference[0]['digest']}" in run.output  # bitwise the same parameters
