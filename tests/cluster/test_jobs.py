"""Slurm without Slurm: srun's variables mapped to rank, local rank and world size (``env``),
the job scripts lesson 16 shows (``ddp_tutorial.cluster.jobs``), and a stop all ranks agree on.

``make slurm-test`` (tests/slurm) submits the scripts to a real Slurm.

Covers ``ddp_tutorial.cluster.jobs``, ``ddp_tutorial.env.slurm``,
``ddp_tutorial.training.preemption``.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys

import pytest
import slurm_workers
import torch

from ddp_tutorial.cluster import jobs
from ddp_tutorial.env import SlurmError, rank_info, slurm_launcher_env, slurm_rank_info, tasks_per_node
from ddp_tutorial.launch import spawn
from ddp_tutorial.training import train
from ddp_tutorial.training.checkpoint import same_weights
from ddp_tutorial.training.preemption import PREEMPTED_EXIT_CODE, StopRequest, resume_running
from ddp_tutorial.training.train import TrainConfig, build_parser


@pytest.mark.parametrize("spec, counts", [
    ("4", [4]), ("2(x3),1", [2, 2, 2, 1]), ("1,3(x2)", [1, 3, 3]), ("8(x1)", [8]), (" 2 , 2 ", [2, 2]),
])
def test_tasks_per_node_expands_slurms_compressed_counts(spec, counts):
    assert tasks_per_node(spec) == counts


@pytest.mark.parametrize("spec", ["", "2x3", "2(3)", "0", "2(x0)", "a", "2(x3),", "-1"])
def test_malformed_task_counts_are_a_clear_error(spec):
    with pytest.raises(SlurmError, match="malformed task count .* like '2\\(x3\\),1'"):
        tasks_per_node(spec)


def srun_environments(counts: list[int], per_node_var: str, per_node_value: str) -> list[dict]:
    """What srun gives each task with the default block distribution: node by node, rank by rank."""
    envs, rank = [], 0
    for node, count in enumerate(counts):
        for local in range(count):
            envs.append({"SLURM_PROCID": str(rank), "SLURM_LOCALID": str(local), "SLURM_NODEID": str(node),
                         "SLURM_NTASKS": str(sum(counts)), per_node_var: per_node_value})
            rank += 1
    return envs


@pytest.mark.parametrize("counts, var, value", [
    ([2, 2, 2, 1], "SLURM_TASKS_PER_NODE", "2(x3),1"),
    ([2, 2, 2, 1], "SLURM_STEP_TASKS_PER_NODE", "2(x3),1"),
    ([4, 4], "SLURM_NTASKS_PER_NODE", "4"),  # --ntasks-per-node=4: one number for every node
    ([1], "SLURM_TASKS_PER_NODE", "1"),
])
def test_every_task_gets_a_distinct_rank_and_its_nodes_size(counts, var, value):
    infos = [slurm_rank_info(env) for env in srun_environments(counts, var, value)]
    assert sorted(i.rank for i in infos) == list(range(sum(counts)))
    assert {i.world_size for i in infos} == {sum(counts)}
    for node, count in enumerate(counts):
        on_node = [i for i in infos if i.node_rank == node] if len(set(counts)) == 1 else \
                  infos[sum(counts[:node]):sum(counts[:node + 1])]
        assert [i.local_rank for i in on_node] == list(range(count))
        assert {i.local_world_size for i in on_node} == {count}


def test_the_launcher_env_reads_back_as_the_same_ranks():
    # the 7th task of "2(x3),1": alone on the 4th node
    env = srun_environments([2, 2, 2, 1], "SLURM_TASKS_PER_NODE", "2(x3),1")[6]
    torch_env = slurm_launcher_env(env)
    assert torch_env == {"RANK": "6", "LOCAL_RANK": "0", "WORLD_SIZE": "7", "LOCAL_WORLD_SIZE": "1",
                         "GROUP_RANK": "3"}
    info = rank_info(torch_env)
    assert (info.rank, info.local_rank, info.world_size, info.local_world_size) == (6, 0, 7, 1)


@pytest.mark.parametrize("change, message", [
    ({"SLURM_PROCID": None}, "SLURM_PROCID not set: start each rank with srun"),
    ({"SLURM_NTASKS": "two"}, "malformed Slurm environment"),
    ({"SLURM_TASKS_PER_NODE": None}, "SLURM_TASKS_PER_NODE not set"),
    ({"SLURM_NTASKS": "6"}, "adds up to 7 tasks, but SLURM_NTASKS=6"),
    ({"SLURM_PROCID": "7"}, "SLURM_PROCID=7 is not in range for SLURM_NTASKS=7"),
    ({"SLURM_LOCALID": "1"}, "SLURM_LOCALID=1 is not in range for 1 task\\(s\\) on node 3"),
    ({"SLURM_NODEID": "4"}, "SLURM_NODEID=4 but SLURM_TASKS_PER_NODE='2\\(x3\\),1' lists 4 node"),
])
def test_broken_slurm_environments_name_the_variable(change, message):
    env = srun_environments([2, 2, 2, 1], "SLURM_TASKS_PER_NODE", "2(x3),1")[6]
    for name, value in change.items():
        if value is None:
            env.pop(name)
        else:
            env[name] = value
    with pytest.raises(SlurmError, match=message):
        slurm_rank_info(env)


def test_export_rank_env_needs_the_first_nodes_address():
    env = srun_environments([2], "SLURM_NTASKS_PER_NODE", "2")[1]
    with pytest.raises(SlurmError, match="MASTER_ADDR not set: the job script exports it"):
        jobs.export_rank_env(dict(env))
    env.update(MASTER_ADDR="10.0.0.1", MASTER_PORT="29500")
    jobs.export_rank_env(env)
    assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"]) == ("1", "1", "2")


def test_single_node_picks_a_port_free_on_loopback():
    # The script's own PORT line, run by bash with the job's python first on PATH: a port 127.0.0.1 can bind now.
    (line,) = [line for line in jobs.script_text("single_node.sbatch").splitlines() if line.startswith("PORT=$(")]
    env = dict(os.environ, PATH=os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")]))
    done = subprocess.run(["bash", "-c", f'{line}\necho "$PORT"'], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    port = int(done.stdout)
    assert 1024 <= port <= 65535
    with socket.create_server(("127.0.0.1", port)):
        pass


def test_the_scripts_say_what_the_lesson_teaches():
    texts = {name: jobs.script_text(name) for name in jobs.SCRIPTS}
    for name, text in texts.items():
        assert text.startswith("#!/bin/bash\n"), name
        assert re.search(r"^#SBATCH --time=", text, re.M), name
    single = texts["single_node.sbatch"]  # one node meets on loopback, as the course's other commands (lesson 09)
    assert 'srun torchrun --master-addr=127.0.0.1 --master-port="$PORT" ' in single
    assert single.index("PORT=$(") < single.index("srun torchrun")
    assert not re.search(r"^[^#]*--standalone", single, re.M)
    multi = texts["multi_node.sbatch"]
    assert re.search(r"^#SBATCH --ntasks-per-node=1 ", multi, re.M)  # one torchrun per node
    for needed in ('scontrol show hostnames "$SLURM_JOB_NODELIST"', "--rdzv-backend=c10d",
                   '--rdzv-id="${SLURM_JOB_ID}.${SLURM_RESTART_COUNT:-0}"', '--nnodes="$SLURM_NNODES"'):
        assert needed in multi
    for name, text in texts.items():  # srun (Slurm >= 22.05) does not inherit --cpus-per-task by itself
        assert "export SRUN_CPUS_PER_TASK=$SLURM_CPUS_PER_TASK" in text, name
    assert "srun python -m ddp_tutorial.cluster.jobs ddp_tutorial.training.train" in texts["srun_ranks.sbatch"]
    requeue = texts["requeue.sbatch"]
    for needed in ("#SBATCH --requeue", "#SBATCH --signal=B:USR1@", "--stop-on-signal USR1,TERM",
                   f'if [ "$code" -eq {PREEMPTED_EXIT_CODE} ]', 'scontrol requeue "$SLURM_JOB_ID"'):
        assert needed in requeue
    # a trap runs only once the foreground command returns: srun in the background, then wait (twice)
    assert re.search(r"^trap .*kill -USR1 \"\$SRUN_PID\"' USR1$", requeue, re.M) and '"$@" &\nSRUN_PID=$!' in requeue
    assert requeue.count('wait "$SRUN_PID"') >= 2


def test_the_cli_lists_shows_and_refuses(capsys):
    assert jobs.main(["list"]) == 0
    assert capsys.readouterr().out.split()[0] == "single_node.sbatch"
    assert jobs.main(["show", "requeue.sbatch"]) == 0
    assert capsys.readouterr().out == jobs.script_text("requeue.sbatch")
    assert jobs.main(["show", "nope.sbatch"]) == 2
    assert "no job script 'nope.sbatch'; the course has: single_node.sbatch" in capsys.readouterr().err


def test_a_signal_on_one_rank_stops_every_rank_after_that_epoch(tmp_path):
    config = TrainConfig(num_epochs=3, log=False, checkpoint=str(tmp_path / "ckpt.pt"), resume=True,
                         stop_on_signal="USR1")
    results = spawn(slurm_workers.train_signalled_in_first_epoch, 2, args=(config,), threads=1, timeout=100)
    assert [r["preempted"] for r in results] == [True, True]
    assert [len(r["history"]) for r in results] == [1, 1]  # both stopped after epoch 1, checkpointed
    assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL  # the parent never listened


def test_stop_on_signal_needs_a_checkpoint_and_a_real_signal():
    with pytest.raises(ValueError, match="unknown signal 'USR9'"):
        StopRequest("USR9")
    assert build_parser().parse_args(["--stop-on-signal", "USR1"]).stop_on_signal == "USR1"
    assert StopRequest(None).agreed() is False
    assert StopRequest("usr1, SIGTERM").signames == ("USR1", "TERM")


def test_a_request_tells_which_signal_arrived_and_puts_the_old_handlers_back():
    with StopRequest("USR1,TERM") as stop:
        signal.raise_signal(signal.SIGTERM)  # would end the process under the default handler
        assert stop.arrived == {"TERM"}
        assert stop.agreed(among=["TERM"]) and stop.agreed() and not stop.agreed(among=["USR1"])
        assert not stop.agreed(among=["USR2"])  # not listened to: no collective, never agreed
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL and signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL


@pytest.mark.slow  # make test stays under 12 minutes; make test-slow and CI run it
def test_sigterm_mid_epoch_checkpoints_the_step_and_resumes_to_the_uninterrupted_weights(tmp_path):
    """Preemption's SIGTERM leaves seconds: the ranks stop after the step, not the epoch, and lose nothing."""
    ckpt = str(tmp_path / "ckpt.pt")
    config = TrainConfig(num_epochs=2, log=False, checkpoint=ckpt, resume=True, stop_on_signal="USR1,TERM")
    stopped = spawn(slurm_workers.train_terminated_at_step, 2, args=(config, 5), threads=1, timeout=100)
    # SIGTERM came during step 5 on one rank: the agreement before step 6 stops both ranks there
    assert [(r["preempted"], r["steps"], r["history"]) for r in stopped] == [(True, 5, [])] * 2
    assert [r["sigterm_after"] for r in stopped] == [False, True]  # only the rank that got it ignores repeats
    saved = torch.load(ckpt, weights_only=True)
    assert (saved["epoch"], saved["step"], saved["partial"]["batches"]) == (0, 5, 5)  # 5 of epoch 1's steps

    resumed = spawn(train.train, 2, args=(config,), threads=1, timeout=100)
    assert resumed[0]["attempt"] == 0 and len(resumed[0]["history"]) == 2
    reference = spawn(train.train, 2, args=(TrainConfig(num_epochs=2, log=False),), threads=1, timeout=100)
    assert resumed[0]["steps"] == reference[0]["steps"]
    assert resumed[0]["history"] == reference[0]["history"]  # the interrupted epoch's loss too, bit for bit
    assert same_weights(resumed[0]["weights"], reference[0]["weights"])


def test_a_partial_epoch_from_another_world_size_restarts_that_epoch():
    partial = {"batches": 4, "running": [torch.tensor([1.0, 2.0], dtype=torch.float64)] * 2, "world_size": 2}
    assert resume_running(partial, 1, 2, torch.device("cpu"))[0] == 4
    assert resume_running(partial, 1, 2, torch.device("cpu"))[1].tolist() == [1.0, 2.0]
    done, running = resume_running(partial, 0, 3, torch.device("cpu"))
    assert (done, running.tolist()) == (0, [0.0, 0.0])
