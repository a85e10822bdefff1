"""ddp_tutorial.comm.process_groups (lesson 02): init methods, the default backend, the GPU set-up, sub-groups,
barrier, timeouts. The launchers are in test_start_methods.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ddp_tutorial import env
from ddp_tutorial.comm import process_groups as pg
from ddp_tutorial.launch import WorkerError, spawn

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("method", pg.INIT_METHODS)
@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_every_init_method_forms_a_working_group(method, world_size, tmp_path):
    results = spawn(pg.join_with, world_size, args=(method, str(tmp_path / "store")),
                    init_process_group=False, timeout=60)
    assert [r["rank"] for r in results] == list(range(world_size))
    assert {r["world_size"] for r in results} == {world_size}
    assert {r["init_method"] for r in results} == {method}
    assert [r["sum"] for r in results] == [sum(range(1, world_size + 1))] * world_size


def test_init_url_forms_and_errors(tmp_path, monkeypatch):
    monkeypatch.setenv("MASTER_ADDR", "10.1.2.3")
    monkeypatch.setenv("MASTER_PORT", "4567")
    assert pg.init_url("env") == "env://"
    assert pg.init_url("tcp") == "tcp://10.1.2.3:4567"
    monkeypatch.chdir(tmp_path)
    assert pg.init_url("file", "store") == "file://" + str(tmp_path / "store")  # made absolute
    with pytest.raises(ValueError, match="needs a path"):
        pg.init_url("file")
    with pytest.raises(ValueError, match="unknown init method 'udp'"):
        pg.init_url("udp")


def test_a_missing_variable_is_named_in_the_error():
    errors = spawn(pg.what_init_needs, 1, init_process_group=False, timeout=60)[0]
    assert list(errors) == list(pg.INIT_VARIABLES)
    for variable, message in errors.items():
        assert variable in message and "expected, but not set" in message


def test_without_a_backend_torch_registers_the_default_for_the_accelerator():
    result = spawn(pg.without_a_backend, 1, init_process_group=False, timeout=60)[0]
    accelerator = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None
    device = "cpu" if accelerator is None else accelerator.type
    # torch's documented defaults, written out; one pair, not "cpu:gloo,cuda:nccl" as before torch 2.6
    documented = {"cpu": "gloo", "cuda": "nccl", "xpu": "xccl", "mps": "gloo"}
    assert result["device"] == device
    assert result["backend_config"] == f"{device}:{documented[device]}"


@pytest.mark.parametrize("gpus, procs", [(0, 1), (0, 2), (1, 1), (1, 2), (2, 2), (2, 4), (4, 2), (8, 8)])
def test_gpu_setup_puts_local_rank_r_on_cuda_r_when_every_rank_has_a_gpu(gpus, procs):
    for lr in range(procs):
        plan = pg.gpu_setup(lr, procs, gpus)
        if gpus >= procs:  # the reference, written out: one GPU per local rank
            cuda = torch.device(f"cuda:{lr}")
            assert plan == {"backend": "nccl", "device": cuda, "set_device": cuda, "device_id": cuda}
        else:
            cpu = torch.device("cpu")
            assert plan == {"backend": "gloo", "device": cpu, "set_device": None, "device_id": None}
    assert pg.gpu_setup(0, 2, 2, nccl_available=False)["backend"] == "gloo"


@pytest.mark.parametrize("lr", [0, 3])
def test_gpu_setup_agrees_with_what_set_device_for_does(monkeypatch, lr):
    made_current = []
    monkeypatch.setattr(env.devices, "cuda_device_count", lambda: 4)  # a node with 4 GPUs, simulated
    monkeypatch.setattr(torch.cuda, "set_device", made_current.append)
    device = env.set_device_for(lr, "nccl")
    plan = pg.gpu_setup(lr, 4, cuda_devices=4)
    assert made_current == [plan["set_device"]] and device == plan["device"] == torch.device("cuda", lr)
    assert env.bound_device(device) == plan["device_id"]


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_subgroups_reduce_only_inside_their_group(world_size):
    results = spawn(pg.subgroup_sums, world_size, timeout=60)
    evens, odds = list(range(0, world_size, 2)), list(range(1, world_size, 2))
    for rank, r in enumerate(results):
        members = evens if rank % 2 == 0 else odds
        assert r["members"] == members
        assert r["group_rank"] == members.index(rank)
        assert r["group_size"] == len(members)
        assert r["group_sum"] == float(sum(members))
        assert r["world_sum"] == float(sum(range(world_size)))


def test_barrier_makes_every_rank_see_rank0s_file(tmp_path):
    results = spawn(pg.prepare_then_read, 3, args=(str(tmp_path / "data.txt"), True, 0.5), timeout=60)
    assert results == ["prepared by rank 0"] * 3
    assert not list(tmp_path.glob("*.tmp"))  # written through a temporary name, then renamed


def test_without_the_barrier_the_others_look_before_rank0_wrote(tmp_path):
    results = spawn(pg.prepare_then_read, 3, args=(str(tmp_path / "data.txt"), False, 0.0), timeout=60)
    assert results == ["prepared by rank 0", None, None]


def test_a_missed_collective_times_out_on_the_waiting_rank():
    results = spawn(pg.missed_collective, 2, args=(1.0,), init_process_group=False, timeout=60)
    assert results[0]["outcome"].endswith(": timed out")
    assert results[0]["waited >= timeout"] is True
    assert results[1]["outcome"] == "never called all_reduce"


def test_lifecycle_after_destroy_no_collective_works():
    results = spawn(pg.lifecycle, 2, init_process_group=False, timeout=60)
    assert results[0] == results[1]
    states = dict(results[0])
    assert states["before init"] == "is_initialized=False"
    assert states["after init"] == "is_initialized=True, world_size=2"
    assert states["after destroy"] == "is_initialized=False"
    assert states["all_reduce after destroy"].startswith("ValueError: Default process group")


def test_an_unknown_init_method_fails_the_worker_not_hangs_it():
    with pytest.raises(WorkerError, match="unknown init method"):
        spawn(pg.join_with, 1, args=("udp",), init_process_group=False, timeout=60)


def test_module_runs_alone_as_a_world_of_one():
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR")}
    proc = subprocess.run([sys.executable, "-m", "ddp_tutorial.comm.process_groups"], capture_output=True,
                          text=True, timeout=90, env=env, cwd=Path(__file__).parent)
    assert proc.returncode == 0, proc.stderr
    assert "rank 0 of 1" in proc.stdout and "process groups: OK" in proc.stdout
