"""Lesson 10: device maps, the split model, micro-batch pipelines and the stage x replica grid.

Covers ``ddp_tutorial.pipeline_parallel.model_parallel``,
``ddp_tutorial.pipeline_parallel.pipeline``, ``ddp_tutorial.pipeline_parallel.pipeline_grid``,
``ddp_tutorial.plots.timelines``.
"""

from __future__ import annotations

import re
import threading

import pytest
import torch
from torch import nn

from ddp_tutorial.env import cuda_device_count
from ddp_tutorial.launch import WorkerError, spawn, torchrun
from ddp_tutorial.models import ToyModel
from ddp_tutorial.pipeline_parallel.model_parallel import (
    ToyMpModel,
    ddp_mp_worker,
    device_map,
    model_parallel_backend,
    model_parallel_plan,
    train_reference,
    training_memory,
)
from ddp_tutorial.pipeline_parallel.pipeline import (
    bubble_fraction,
    ideal_schedule,
    idle_fraction,
    microbatch_forward,
    pipelined_forward,
)
from ddp_tutorial.pipeline_parallel.pipeline_grid import Grid, grid_worker, mlp_stages, train_whole_model
from ddp_tutorial.pipeline_parallel.pipeline_grid import main as pipeline_grid_main

# ---------------------------------------------------------------- device maps

@pytest.mark.parametrize("local_world_size", [1, 2, 3, 4])
def test_device_map_on_cpu_uses_the_cpu_twice(local_world_size):
    for r in range(local_world_size):
        assert device_map(r, local_world_size, 0) == (torch.device("cpu"), torch.device("cpu"))


@pytest.mark.parametrize("cuda_devices", range(1, 9))
@pytest.mark.parametrize("local_world_size", [1, 2, 3, 4])
def test_device_map_gives_each_rank_two_gpus_of_its_own(cuda_devices, local_world_size):
    if 2 * local_world_size > cuda_devices:
        with pytest.raises(ValueError, match=f"need {2 * local_world_size} GPUs.*has {cuda_devices}"):
            device_map(local_world_size - 1, local_world_size, cuda_devices)
        return
    maps = [device_map(r, local_world_size, cuda_devices) for r in range(local_world_size)]
    assert [[d.index for d in m] for m in maps] == [[2 * r, 2 * r + 1] for r in range(local_world_size)]
    used = [d.index for m in maps for d in m]
    assert len(set(used)) == len(used) and max(used) < cuda_devices
    assert all(d.type == "cuda" for m in maps for d in m)


def test_device_map_rejects_a_local_rank_out_of_range():
    with pytest.raises(ValueError, match="local_rank 2"):
        device_map(2, 2, 8)


def test_backend_falls_back_to_gloo_without_two_gpus_per_rank():
    assert model_parallel_backend(2, cuda_devices=3) == "gloo"
    assert model_parallel_backend(1, cuda_devices=0) == "gloo"


@pytest.mark.parametrize("cuda_devices, local_world_size, backend, first_devices", [
    (0, 2, "gloo", ["cpu", "cpu"]),
    (1, 1, "gloo", ["cpu"]),                 # one GPU cannot hold both halves of a rank
    (2, 1, "nccl", ["cuda:0"]),
    (3, 2, "gloo", ["cpu", "cpu"]),          # rank 1 would need GPUs 2 and 3: nobody borrows
    (4, 2, "nccl", ["cuda:0", "cuda:2"]),    # rank 1 makes cuda:2 current, never cuda:1
    (8, 4, "nccl", ["cuda:0", "cuda:2", "cuda:4", "cuda:6"]),
    (8, 2, "nccl", ["cuda:0", "cuda:2"]),    # spare GPUs stay unused
])
def test_plan_gives_each_rank_its_own_devices_and_the_first_one_becomes_current(
        cuda_devices, local_world_size, backend, first_devices):
    plans = [model_parallel_plan(r, local_world_size, cuda_devices, nccl_available=True)
             for r in range(local_world_size)]
    assert {b for b, _ in plans} == {backend}
    assert [str(devices[0]) for _, devices in plans] == first_devices
    if backend == "nccl":  # what launch.spawn would have made current (cuda:local_rank) is not assumed
        owned = [d for _, devices in plans for d in devices]
        assert len(set(owned)) == len(owned) == 2 * local_world_size
        for r, (_, devices) in enumerate(plans):
            assert [d.index for d in devices] == [2 * r, 2 * r + 1]


def test_without_nccl_the_plan_is_the_cpu_whatever_the_gpus():
    assert model_parallel_plan(1, 2, 8, nccl_available=False) == ("gloo", (torch.device("cpu"),) * 2)


# ---------------------------------------------------------------- the split model

def _pair(seed=0):
    torch.manual_seed(seed)
    whole = ToyModel().double()
    split = ToyMpModel("cpu", "cpu").double()
    split.load_state_dict(whole.state_dict())
    return whole, split


def _grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters()}


def test_split_model_equals_unsplit_model_forward_and_backward():
    whole, split = _pair()
    x, y = torch.randn(7, 10, dtype=torch.float64), torch.randn(7, 5, dtype=torch.float64)
    nn.functional.mse_loss(whole(x), y).backward()
    nn.functional.mse_loss(split(x), y).backward()
    assert torch.allclose(whole(x), split(x), atol=0, rtol=0)
    for name, grad in _grads(whole).items():
        assert torch.allclose(grad, _grads(split)[name], atol=0, rtol=0)


@pytest.mark.parametrize("forward", [microbatch_forward, pipelined_forward])
@pytest.mark.parametrize("num_micro", [1, 3, 4, 10])
def test_micro_batches_equal_the_full_batch(forward, num_micro):
    whole, split = _pair(seed=num_micro)
    x, y = torch.randn(10, 10, dtype=torch.float64), torch.randn(10, 5, dtype=torch.float64)
    out = forward(split, x, num_micro)
    ref = whole(x)
    assert out.shape == ref.shape and torch.allclose(out, ref, atol=1e-12)
    nn.functional.mse_loss(out, y).backward()
    nn.functional.mse_loss(ref, y).backward()
    for name, grad in _grads(whole).items():
        assert torch.allclose(grad, _grads(split)[name], atol=1e-12)


def test_pipelined_forward_overlaps_in_order_and_records_every_stage():
    _, split = _pair()
    events = []
    with torch.no_grad():
        pipelined_forward(split, torch.randn(8, 10, dtype=torch.float64), 4, events)
    assert sorted((s, i) for s, i, _, _ in events) == [(s, i) for s in range(2) for i in range(4)]
    ends0 = {i: end for s, i, _, end in events if s == 0}
    for s, i, start, _ in events:
        if s == 1:  # stage 1 only starts a micro-batch once stage 0 has produced it
            assert start >= ends0[i]


def test_pipelined_forward_reraises_a_stage_error():
    _, split = _pair()
    bad = torch.randn(4, 3, dtype=torch.float64)  # 3 features where stage 0 takes 10
    with pytest.raises(RuntimeError, match="mat1 and mat2 shapes cannot be multiplied") as plain:
        split(bad[:2])
    threads_before = threading.active_count()
    # stage 0's own error, re-raised in the caller's thread (the same one a plain forward raises)
    with pytest.raises(RuntimeError, match=re.escape(str(plain.value))):
        pipelined_forward(split, bad, 2)

    def broken(h):
        raise ValueError("stage 1 gave up")

    split.stage1 = broken  # an error in the last stage: no hang, same exception type
    with pytest.raises(ValueError, match="stage 1 gave up"):
        pipelined_forward(split, torch.randn(4, 10, dtype=torch.float64), 2)
    assert threading.active_count() == threads_before  # both stage threads have ended


@pytest.mark.parametrize("stages,micro", [(2, 1), (2, 4), (3, 2), (4, 8)])
def test_ideal_schedule_bubble_matches_the_formula(stages, micro):
    events = ideal_schedule(stages, micro)
    assert len(events) == stages * micro
    assert idle_fraction(events, stages) == pytest.approx(bubble_fraction(stages, micro))
    assert max(e[3] for e in events) == pytest.approx((micro + stages - 1) / micro)


# ---------------------------------------------------------------- across processes

@pytest.mark.timeout(90)
def test_ddp_around_a_two_device_model_equals_one_process_training():
    results = spawn(ddp_mp_worker, 2, args=(4, 0.1, 8, 3), init_process_group=False, timeout=60, quiet=True)
    ref = train_reference(4, 0.1, 16, 3)
    for rank, r in enumerate(results):  # the CPU twice here; cuda:2r, cuda:2r+1 with 4 GPUs
        assert r["devices"] == [str(d) for d in model_parallel_plan(rank, 2, cuda_device_count())[1]]
        assert r["losses"] == pytest.approx(ref["losses"], abs=1e-6)
        for name, value in ref["state"].items():
            assert torch.allclose(r["state"][name], value, atol=1e-6)


@pytest.mark.timeout(60)
def test_model_parallel_worker_refuses_a_group_the_launcher_set_up():
    # launch.spawn's own group would have made cuda:rank current: on GPUs, another rank's device
    with pytest.raises(WorkerError, match="init_process_group=False"):
        spawn(ddp_mp_worker, 2, timeout=30, quiet=True)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("world_size,widths,global_batch,num_micro", [
    (4, (10, 10, 5), 8, 2),         # 2 stages x 2 replicas
    (3, (10, 7, 6, 5), 6, 3),       # 3 stages x 1 replica
])
def test_grid_training_equals_one_process_training(world_size, widths, global_batch, num_micro):
    steps = 4
    results = spawn(grid_worker, world_size, args=(steps, 0.1, global_batch, num_micro, widths, 1),
                    timeout=60, quiet=True)
    ref = train_whole_model(steps, 0.1, global_batch, widths, 1)
    grid = Grid(world_size, len(widths) - 1)
    for r in results:
        assert (r["stage"], r["replica"]) == (grid.stage_of(r["rank"]), grid.replica_of(r["rank"]))
        assert r["rank"] in r["pipeline"] and r["rank"] in r["data_parallel"]
        for name, value in ref["states"][r["stage"]].items():
            assert torch.allclose(r["state"][name], value, atol=1e-6, rtol=0)
        if r["stage"] == grid.num_stages - 1:
            assert r["losses"] == pytest.approx(ref["losses"], abs=1e-6)
            # the last stage backpropagates each micro-batch right after its forward
            assert r["schedule"] == [f"{p}{m}" for m in range(num_micro) for p in "FB"]
        else:
            assert r["losses"] is None
            # the other stages: every forward, then every backward (GPipe)
            assert r["schedule"] == [f"F{m}" for m in range(num_micro)] + [f"B{m}" for m in range(num_micro)]
    start = mlp_stages(widths, 1)[0].state_dict()
    assert not torch.allclose(ref["states"][0]["0.weight"], start["0.weight"]), "training never moved the weights"


def test_grid_layout_2x2():
    grid = Grid(4, 2)
    assert grid.num_replicas == 2
    assert [grid.pipeline_ranks(r) for r in range(2)] == [[0, 1], [2, 3]]
    assert [grid.data_parallel_ranks(s) for s in range(2)] == [[0, 2], [1, 3]]


@pytest.mark.parametrize("world_size,num_stages", [(3, 2), (6, 4), (1, 2), (5, 3)])
def test_grid_that_does_not_divide_the_world_is_refused(world_size, num_stages):
    with pytest.raises(ValueError, match=f"world_size={world_size}.*multiple of {num_stages}"):
        Grid(world_size, num_stages)


@pytest.mark.timeout(60)
def test_grid_worker_refuses_a_bad_world_and_a_bad_batch():
    with pytest.raises(WorkerError, match="multiple of 2"):
        spawn(grid_worker, 3, timeout=30, quiet=True)
    with pytest.raises(WorkerError, match="does not split evenly"):
        spawn(grid_worker, 2, args=(1, 0.1, 8, 3), timeout=30, quiet=True)


def test_pipeline_grid_alone_fails_with_one_line(monkeypatch, capsys):
    monkeypatch.delenv("RANK", raising=False)  # a plain `python -m`: a world of one
    with pytest.raises(SystemExit) as exit_info:
        pipeline_grid_main([])
    assert exit_info.value.code == 2  # a usage error, as argparse's
    assert capsys.readouterr().err.splitlines() == [
        "python -m ddp_tutorial.pipeline_parallel.pipeline_grid: error: a grid of 2 pipeline stages cannot cover "
        "world_size=1: the world size must be a multiple of 2 (stages x replicas); start it with torchrun "
        "--nproc-per-node=4 -m ddp_tutorial.pipeline_parallel.pipeline_grid"]


@pytest.mark.slow  # a torchrun command: make test-slow (CI)
@pytest.mark.timeout(150)
def test_pipeline_grid_under_torchrun_matches_one_process():
    # 2 processes: one pipeline of 2 stages (the 2 x 2 grid itself is tested through spawn above)
    run = torchrun("ddp_tutorial.pipeline_parallel.pipeline_grid", nproc_per_node=2, timeout=120)
    assert "grid training equals one process training the whole model: True" in run.output
    assert "rank 1: stage 1 of replica 0, pipeline [0, 1], data-parallel group [1]" in run.output


# ---------------------------------------------------------------- memory arithmetic

def test_training_memory_arithmetic():
    n = 1e9  # fp32 + Adam: 4 B params + 4 B grads + 8 B optimizer = 16 B per parameter
    assert training_memory(n, 8, "ddp") == {"params": 4e9, "grads": 4e9, "optimizer": 8e9, "total": 16e9}
    assert training_memory(n, 8, "fsdp")["total"] == 2e9
    assert training_memory(n, 8, "pipeline", num_stages=4)["total"] == 4e9
    with pytest.raises(ValueError, match="strategy"):
        training_memory(n, 8, "zero")
