"""Crash and restart under torchrun, resumed from a DCP checkpoint (``ddp_tutorial.sharding.sharded_resume``)."""

from __future__ import annotations

import os

import pytest

from ddp_tutorial.launch import spawn, torchrun
from ddp_tutorial.sharding.sharded_resume import latest_step, train_with_checkpoints


@pytest.mark.slow  # make test stays under 12 minutes; make test-slow and CI run it
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


@pytest.mark.timeout(200)
def test_each_rank_resumes_its_own_rng_and_data_position(tmp_path):
    from torch.distributed.checkpoint import FileSystemReader

    from tests.sharding.resume_workers import resume_forgetting_rng

    folder, forgot = str(tmp_path / "resumed"), str(tmp_path / "forgot")
    for where in (folder, forgot):
        spawn(train_with_checkpoints, 2, args=(where, 2), timeout=100)
    # rank-specific keys: DCP would keep one copy of a key that every rank shares
    keys = FileSystemReader(os.path.join(folder, "step-2")).read_metadata().state_dict_metadata
    assert {f"app.{kind}.rank{r}" for kind in ("rng", "data") for r in (0, 1)} <= set(keys)
    resumed = spawn(train_with_checkpoints, 2, args=(folder, 4), timeout=100)
    straight = spawn(train_with_checkpoints, 2, args=(str(tmp_path / "straight"), 4), timeout=100)
    assert [r["resumed from"] for r in resumed] == [2, 2]
    for mine, reference in zip(resumed, straight):  # each rank: its own RNG stream and data position back
        assert (mine["digest"], mine["rng"], mine["position"]) == (reference["digest"], reference["rng"], 4)
    assert resumed[0]["rng"] != resumed[1]["rng"]  # the ranks' streams differ: one shared key could not hold both
    # the same resume with a fresh RNG masks other tokens: not the weights of the run that never stopped
    wrong = spawn(resume_forgetting_rng, 2, args=(forgot, 4), timeout=100)
    assert wrong[0]["digest"] != straight[0]["digest"]
