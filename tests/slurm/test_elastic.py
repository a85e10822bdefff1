"""Elastic torchrun for real (lesson 16): a node joins and one leaves a running job, the workers
restart from the last checkpoint with the new world size; and ``@record`` reports the failing
rank's traceback, with torchrun's --log-dir, --redirects, --tee and --local-ranks-filter.

Run by ``make slurm-test`` (about a minute; no Slurm needed for these).
"""

from __future__ import annotations

import itertools
import json

import pytest
import torch

from ddp_tutorial.cluster.elastic import join_and_leave, record_failure, replay

# no Slurm: make slurm-test runs these beside the Slurm tests, one at a time
pytestmark = pytest.mark.xdist_group("elastic")


@pytest.mark.timeout(420)  # two agents, restarts, then the replay: minutes on a busy 2-core machine
def test_a_node_joins_and_leaves_and_training_resumes_each_time_to_the_same_weights(tmp_path):
    run = join_and_leave(str(tmp_path))
    a, b = run["a"], run["b"]
    assert a.returncode == 0, a.output
    assert b.returncode != 0, b.output  # B was stopped: its agent reports the signal
    # the world size, epoch by epoch: alone, then with B, then alone again
    assert [size for size, _ in itertools.groupby(run["world_sizes"])] == [1, 2, 1], run["world_sizes"]
    assert len(run["world_sizes"]) == 40
    # what agent A said: B's arrival restarts the workers (a membership change, not a failure) ...
    assert "Detected 1 new nodes from group_rank=0; will restart worker group" in a.output
    assert "global_world_sizes=[2]" in a.output
    # ... B's departure fails A's worker mid all-reduce: one of --max-restarts=3 is used
    assert "Worker group FAILED. 3/3 attempts left; will restart worker group" in a.output
    assert "restart_count=1" in a.output
    # both restarts resumed from rank 0's last checkpoint
    assert "attempt 0" in a.output and "resumed from elastic.pt after epoch" in a.output
    assert "), attempt 1" in a.output
    assert "after 40 epochs, 1 process(es)" in a.output

    # the same epochs with the same world sizes, by plain torchrun and --resume: bitwise equal
    reference = torch.load(replay(run["world_sizes"], str(tmp_path)), weights_only=True)
    elastic = torch.load(run["checkpoint"], weights_only=True)
    assert elastic["world_sizes"] == reference["world_sizes"] == run["world_sizes"]
    for name, tensor in reference["model"].items():
        assert torch.equal(elastic["model"][name], tensor), f"{name} differs from the replayed run"
    assert elastic["history"] == reference["history"]


def test_record_reports_the_failing_ranks_traceback_and_the_logs_land_in_files(tmp_path):
    run = record_failure(str(tmp_path), nproc_per_node=2, failing_rank=1)
    out = run["result"].output
    assert run["result"].returncode == 1, out
    # torchrun's summary names the root cause: rank 1, with its own traceback (from @record)
    assert "Root Cause (first observed failure)" in out
    assert "rank      : 1 (local_rank: 1)" in out
    assert "DeliberateError: rank 1 raises on purpose" in out
    # TORCHELASTIC_ERROR_FILE: the agent's copy of the failing rank's error, as JSON
    message = run["error"]["message"]
    assert message["message"] == "DeliberateError: rank 1 raises on purpose, to show @record's report"
    assert 'ddp_tutorial/cluster/elastic.py", line' in message["extraInfo"]["py_callstack"]
    # --log-dir + --redirects=3: every rank's stdout and stderr in files, per attempt and local rank
    logs = run["logs"]
    for rank in (0, 1):
        assert f"attempt_0/{rank}/stdout.log" in logs and f"attempt_0/{rank}/stderr.log" in logs
    assert "attempt_0/1/error.json" in logs and "attempt_0/0/error.json" not in logs
    with open(logs["attempt_0/1/stderr.log"]) as f:
        assert "DeliberateError: rank 1 raises on purpose" in f.read()
    with open(logs["attempt_0/1/error.json"]) as f:
        assert json.load(f)["message"]["message"] == message["message"]
    # --tee=3 copies them to the console too, prefixed; --local-ranks-filter=0: rank 0's only
    assert "[default0]:rank 0: started" in out
    assert "rank 1: started" not in out
    with open(logs["attempt_0/1/stdout.log"]) as f:
        assert f.read().splitlines()[0] == "rank 1: started"  # torch 2.9's gloo adds "[Gloo] Rank 1 is connected ..."
