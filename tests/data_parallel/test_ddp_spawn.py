"""ddp_tutorial.data_parallel.ddp_spawn: DDP equals one process on the global batch; sampler, checkpoints, no_sync, Join."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from ddp_tutorial.data_parallel import ddp_spawn as d
from ddp_tutorial.env import choose_backend
from ddp_tutorial.launch import WorkerError, spawn
from ddp_tutorial.pitfalls.hangs import expect

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("world_size", [2, 3])
def test_ddp_equals_single_process_on_the_global_batch(world_size):
    dataset = d.regression_data(48, dtype=torch.float64)
    per_rank = 4
    results = spawn(d.train_ddp, world_size, args=(dataset, per_rank, 2, 0.05), timeout=90)
    reference = d.train_single(dataset, per_rank * world_size, 2, 0.05)
    steps = 2 * 48 // (per_rank * world_size)
    assert len(reference["losses"]) == steps and all(len(r["losses"]) == steps for r in results)
    for result in results:
        for name, tensor in reference["state"].items():
            torch.testing.assert_close(result["state"][name], tensor, atol=1e-6, rtol=0)
    # training really moved the weights (otherwise equality would prove nothing)
    torch.manual_seed(0)
    initial = d.ToyModel().double().state_dict()
    assert (reference["state"]["net1.weight"] - initial["net1.weight"]).abs().max() > 1e-2
    # the mean of the ranks' losses is the single process's loss on the same global batch
    mean_loss = torch.tensor([r["losses"] for r in results], dtype=torch.float64).mean(0)
    torch.testing.assert_close(mean_loss, torch.tensor(reference["losses"], dtype=mean_loss.dtype), atol=1e-6, rtol=0)


def test_ddp_broadcasts_rank0_weights_at_construction():
    results = spawn(d.initial_weights, 3, timeout=90)
    assert len({r["before"] for r in results}) == 3  # a seed per rank: three different models
    assert {r["after"] for r in results} == {results[0]["before"]}  # after DDP(): rank 0's everywhere


def test_set_epoch_changes_the_order_and_same_epoch_repeats_it():
    n, world_size = 23, 3
    orders = [d.sampler_orders(rank, world_size, n, 3) for rank in range(world_size)]
    for epoch in range(3):
        drawn = [i for rank in range(world_size) for i in orders[rank][epoch]]
        assert len(drawn) == 24 and set(drawn) == set(range(n))  # padded to a multiple of 3, all covered
    assert orders[0][0] != orders[0][1] != orders[0][2]
    assert d.sampler_orders(0, world_size, n, 3) == orders[0]  # same seed and epoch: same order
    frozen = d.sampler_orders(0, world_size, n, 3, set_epoch=False)
    assert frozen[0] == frozen[1] == frozen[2] == orders[0][0]  # without set_epoch: epoch 0 forever


def test_checkpoint_saved_by_rank0_loads_on_every_rank(tmp_path):
    path = str(tmp_path / "toy.pt")
    results = spawn(d.checkpoint_round_trip, 2, args=(path,), timeout=90)
    assert os.listdir(tmp_path) == ["toy.pt"]  # no temporary file left behind
    for r in results:
        assert r["loaded"] == r["trained"] == results[0]["trained"] and r["step"] == 3
    state = torch.load(path, weights_only=True)
    assert set(state["model"]) == {"net1.weight", "net1.bias", "net2.weight", "net2.bias"}


def test_failed_save_keeps_the_previous_checkpoint(tmp_path):
    path = str(tmp_path / "c.pt")
    d.save_checkpoint({"x": torch.ones(2)}, path)
    with pytest.raises(Exception):
        d.save_checkpoint({"x": lambda: None}, path)  # cannot be pickled
    assert os.listdir(tmp_path) == ["c.pt"]
    torch.testing.assert_close(torch.load(path, weights_only=True)["x"], torch.ones(2))


def test_no_sync_communicates_once_and_gives_the_same_gradients():
    results = spawn(d.accumulate, 2, args=(4,), timeout=90)
    assert [r["no_sync"]["all_reduces"] for r in results] == [1, 1]
    assert [r["every step"]["all_reduces"] for r in results] == [4, 4]
    # DDP decides in forward whether to sync: a forward outside no_sync syncs its backward anyway
    assert [r["backward only in no_sync"]["all_reduces"] for r in results] == [4, 4]
    local = [r["no_sync"]["grads"][0] for r in results]
    assert not torch.equal(local[0], torch.zeros_like(local[0]))
    for a, b, c, e in zip(results[0]["no_sync"]["grads"], results[1]["no_sync"]["grads"],
                          results[0]["every step"]["grads"], results[0]["backward only in no_sync"]["grads"]):
        torch.testing.assert_close(a, b, atol=0, rtol=0)  # averaged: equal on both ranks
        torch.testing.assert_close(a, c, atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(a, e, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("world_size", [2, 3])
def test_join_finishes_with_uneven_inputs(world_size):
    results = spawn(d.uneven_inputs, world_size, args=(True, 3, 30.0), timeout=90)
    assert [r["steps"] for r in results] == [3 + rank for rank in range(world_size)]
    assert len({r["checksum"] for r in results}) == 1  # the final weights agree
    # joined ranks add zeros and the mean still divides by the world size: a one-process replay
    reference, per_active = d.uneven_reference(world_size), d.uneven_reference(world_size, divisor="active")
    for name, tensor in reference.items():
        for r in results:
            torch.testing.assert_close(r["weights"][name], tensor, atol=1e-6, rtol=1e-5)
    assert not all(torch.allclose(reference[k], per_active[k], atol=1e-4) for k in reference)  # the two rules differ


def test_uneven_inputs_without_join_hang_until_the_collective_timeout():
    # gloo raises "Timed out"; on a 2-GPU machine NCCL's watchdog aborts the rank instead
    expected = expect("ddp_uneven_inputs", choose_backend(local_world_size=2))
    with pytest.raises(WorkerError) as info:
        spawn(d.uneven_inputs, 2, args=(False, 3, 3.0), timeout=90)
    assert expected.kind == "error" and expected.says in str(info.value)
    assert info.value.rank == 1  # the rank with the extra batch waits in vain


@pytest.mark.slow  # a torchrun command: make test-slow (CI)
def test_module_runs_alone_with_mp_spawn():
    # `python -m ddp_tutorial.data_parallel.ddp_spawn`: the plain torch.multiprocessing.spawn recipe
    env = dict(os.environ, OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-m", "ddp_tutorial.data_parallel.ddp_spawn", "--num-steps", "2"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert f"final weights checksum {same_run_with_launch_spawn():.6f}" in out.stdout, out.stdout


@pytest.mark.slow  # make test stays under 12 minutes; make test-slow and CI run it
def test_module_runs_under_torchrun():
    from ddp_tutorial.launch import torchrun

    result = torchrun("ddp_tutorial.data_parallel.ddp_spawn", nproc_per_node=2, args=("--num-steps", "2"), timeout=60)
    assert f"final weights checksum {same_run_with_launch_spawn():.6f}" in result.output, result.output


def same_run_with_launch_spawn() -> float:
    """The weights every launcher must end with: toy_example, 2 ranks, 2 steps."""
    # timeout: with the caller's own launch (60 s) well inside the tests' 120 s
    results = spawn(d.toy_example, 2, args=(2,), timeout=45, quiet=True)
    assert results[0]["checksum"] == results[1]["checksum"]
    return results[0]["checksum"]
