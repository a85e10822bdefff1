"""The throwaway Slurm always goes away: with a job still running and the test body failing,
``slurm_cluster()`` cancels the job, shuts Slurm down, stops munged, and leaves no process behind.
"""

from __future__ import annotations

import os
import sys
import time

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from slurm_cluster import leftover_processes, slurm_cluster  # noqa: E402  (after the sys.path line above)

# with test_slurm.py: one throwaway cluster at a time
pytestmark = pytest.mark.xdist_group("slurm")


class Boom(Exception):
    pass


def test_a_failing_body_with_a_running_job_still_leaves_nothing(tmp_path):
    os.chmod(tmp_path, 0o755)
    script = tmp_path / "sleep.sbatch"
    script.write_text("#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=1\nsrun sleep 300\n")
    seen = {}
    with pytest.raises(Boom):
        with slurm_cluster() as cluster:
            seen["root"] = cluster.root
            job_id = cluster.sbatch(str(script), cwd=str(tmp_path))
            cluster.wait(job_id, 60, until=lambda f: f["JobState"] == "RUNNING")
            # the job's processes are there, found by the cluster's folder in their environment
            deadline = time.monotonic() + 30
            while not any(cmd.endswith("bin/sleep 300") for cmd in seen.setdefault("during", [])):
                assert time.monotonic() < deadline, f"the job's sleep never started: {seen['during']}"
                time.sleep(0.2)
                seen["during"] = [cmd for _, cmd in leftover_processes(cluster.root)]
            raise Boom("the test failed while the job ran")
    assert any("slurmstepd" in cmd for cmd in seen["during"]), seen["during"]
    assert any(cmd.endswith("bin/sleep 300") for cmd in seen["during"]), seen["during"]
    assert leftover_processes(seen["root"]) == []
    assert not os.path.exists(seen["root"])  # removed after a clean teardown
