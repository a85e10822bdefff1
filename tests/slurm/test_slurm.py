"""Lesson 16's job scripts, submitted as they are to a real (throwaway, two-node) Slurm.

Run by ``make slurm-test`` (root and Debian's Slurm packages needed; the target installs them).
Each job trains on digits for a few epochs; the tests check the job's state and exit code
as Slurm reports them (``scontrol show job``: there is no accounting database for ``sacct``)
and what the training printed.
"""

from __future__ import annotations

import os
import sys
import time

import pytest
import torch

from ddp_tutorial.cluster.jobs import script_path
from ddp_tutorial.launch import torchrun

sys.path.insert(0, os.path.dirname(__file__))
from slurm_cluster import SlurmUnavailable, slurm_cluster  # noqa: E402  (after the sys.path line above)

# one worker for the Slurm tests (one throwaway cluster at a time);
# make slurm-test runs test_elastic.py beside them on the other worker
pytestmark = pytest.mark.xdist_group("slurm")

JOB_TIMEOUT = 150.0


@pytest.fixture(scope="module")
def cluster():
    try:
        with slurm_cluster() as running:
            yield running
    except SlurmUnavailable as exc:
        pytest.fail(str(exc))


@pytest.fixture
def job_dir(tmp_path):
    os.chmod(tmp_path, 0o755)
    return tmp_path


def job_env() -> dict:
    # the job inherits sbatch's environment (--export=ALL): the course's python and torchrun first
    return {"PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]}


def submit(cluster, script: str, *args: str, cwd, options=()) -> tuple[int, dict, str]:
    job_id = cluster.sbatch(script_path(script), *args, cwd=str(cwd), options=tuple(options), env=job_env())
    fields = cluster.wait(job_id, JOB_TIMEOUT)
    name = fields["JobName"]
    with open(os.path.join(cwd, f"{name}-{job_id}.out"), errors="replace") as f:
        return job_id, fields, f.read()


def test_single_node_torchrun_meets_on_loopback(cluster, job_dir):
    _, job, out = submit(cluster, "single_node.sbatch", "--epochs", "2", cwd=job_dir)
    assert (job["JobState"], job["ExitCode"]) == ("COMPLETED", "0:0"), out
    assert "after 2 epochs, 2 process(es)" in out, out


@pytest.mark.parametrize("cpus_per_task", [1, 2])
def test_two_nodes_one_torchrun_each_meet_at_the_first_node(cluster, job_dir, cpus_per_task):
    _, job, out = submit(cluster, "multi_node.sbatch", "--epochs", "2", cwd=job_dir,
                         options=[f"--cpus-per-task={cpus_per_task}"])
    assert (job["JobState"], job["ExitCode"], job["NumNodes"]) == ("COMPLETED", "0:0", "2"), out
    # one torchrun per node, cpus_per_task ranks each: the world spans both nodes
    assert f"after 2 epochs, {2 * cpus_per_task} process(es)" in out, out
    assert out.count("final test accuracy") == 1, out  # rank 0 alone reports


def test_srun_starts_every_rank_without_torchrun(cluster, job_dir):
    _, job, out = submit(cluster, "srun_ranks.sbatch", "--epochs", "2", cwd=job_dir)
    assert (job["JobState"], job["ExitCode"], job["NumNodes"]) == ("COMPLETED", "0:0", "2"), out
    assert "after 2 epochs, 4 process(es)" in out, out


def test_a_failing_rank_fails_the_job_with_its_exit_code(cluster, job_dir):
    _, job, out = submit(cluster, "srun_ranks.sbatch", "--epochs", "2", "--fail-at-step", "3", cwd=job_dir)
    # train.FAILURE_EXIT_CODE from the last rank, through srun, to the job's ExitCode
    assert (job["JobState"], job["ExitCode"]) == ("FAILED", "13:0"), out
    assert "rank 3: injected failure at step 3" in out, out
    assert "final test accuracy" not in out


# (scancel options, what the job's output must show): USR1 to the batch shell only is what
# --signal=B:USR1@120 sends before the time limit (its trap passes it on); TERM to the steps' tasks
# is what a preemption sends them
STOPS = {"USR1": (["--batch", "--signal=USR1"], ["SIGUSR1: passing it on to the ranks", "on SIGUSR1: checkpoint saved"]),
         "TERM": (["--signal=TERM"], ["on SIGTERM: checkpoint saved"])}


@pytest.mark.timeout(420)  # the job twice, a requeue delay, then the reference run: minutes on a busy machine
@pytest.mark.parametrize("signame", sorted(STOPS))
def test_preempted_job_checkpoints_requeues_and_resumes_to_the_uninterrupted_weights(cluster, job_dir, signame):
    epochs = "4" if signame == "TERM" else "10"
    job_id = cluster.sbatch(script_path("requeue.sbatch"), "--epochs", epochs, cwd=str(job_dir), env=job_env())
    out_file = job_dir / f"ddp-requeue-{job_id}.out"
    deadline = time.monotonic() + JOB_TIMEOUT
    while not (out_file.exists() and f"epoch 1/{epochs}" in out_file.read_text(errors="replace")):
        state = cluster.job(job_id)["JobState"]
        assert state in ("PENDING", "RUNNING", "CONFIGURING"), f"job {job_id} {state} before epoch 1"
        assert time.monotonic() < deadline, f"job {job_id} did not finish epoch 1 in time"
        time.sleep(0.2)
    options, expected = STOPS[signame]
    cluster.command(["scancel", *options, str(job_id)])
    job = cluster.wait(job_id, JOB_TIMEOUT, until=lambda f: f.get("Restarts") == "1" and f["JobState"] == "COMPLETED"
                       or f["JobState"] in ("FAILED", "CANCELLED", "TIMEOUT"))
    out = out_file.read_text(errors="replace")
    assert (job["JobState"], job["ExitCode"], job["Restarts"]) == ("COMPLETED", "0:0", "1"), out
    assert "run 1 of job" in out and "run 2 of job" in out, out
    assert "checkpoint saved; resume with --resume" in out and all(line in out for line in expected), out
    assert "resumed from ckpt-" in out and out.count("no checkpoint yet") == 1, out
    assert f"after {epochs} epochs, 2 process(es)" in out, out

    # the same training, never interrupted: 2 processes on one node, through torchrun
    reference = job_dir / "reference.pt"
    torchrun("ddp_tutorial.training.train", 2, ["--epochs", epochs, "--checkpoint", reference], timeout=120)
    resumed = torch.load(job_dir / f"ckpt-{job_id}.pt", weights_only=True)
    expected = torch.load(reference, weights_only=True)
    assert resumed["epoch"] == expected["epoch"] == int(epochs)
    assert resumed["world_sizes"] == [2] * int(epochs)
    assert resumed["model"].keys() == expected["model"].keys()
    for name, tensor in expected["model"].items():
        assert torch.equal(resumed["model"][name], tensor), f"{name} differs from the uninterrupted run"
    assert resumed["history"] == expected["history"]
