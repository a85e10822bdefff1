"""The training program: convergence, exact resume after a crash, simulated nodes, bad input, checkpoints.

Covers ``ddp_tutorial.training.train``, ``ddp_tutorial.training.options``, ``ddp_tutorial.training.checkpoint``,
``ddp_tutorial.training.data``, ``ddp_tutorial.training.reproducibility``,
``ddp_tutorial.bench.scaling``.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys

import pytest
import torch
import train_workers

from ddp_tutorial.cluster import multinode
from ddp_tutorial.launch import spawn, torchrun
from ddp_tutorial.models import SmallCNN, ToyModel, build_model
from ddp_tutorial.training.checkpoint import CheckpointError, load_checkpoint, same_weights, save_checkpoint
from ddp_tutorial.training.data import digits, load_dataset, make_loaders, shard_indices
from ddp_tutorial.training.reproducibility import determinism_switches, deterministic_for, seed_everything
from ddp_tutorial.training.train import TrainConfig, build_parser, main, train

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _accuracy_in_one_process(weights: dict) -> float:
    """Reference for the all-reduced metric: the whole test split scored by one plain model."""
    model = SmallCNN(1, 10)
    model.load_state_dict(weights)
    test = digits(seed=0).test
    x, y = test.tensors
    with torch.no_grad():
        return (model(x).argmax(1) == y).double().mean().item()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world_size", [1, 2])
def test_digits_converges_and_only_rank0_writes(world_size, tmp_path):
    ckpt = tmp_path / "ckpt" / "digits.pt"
    config = TrainConfig(num_epochs=4, checkpoint=str(ckpt), log=False)
    results = spawn(train, world_size, args=(config,), threads=1, timeout=100)

    history = results[0]["history"]
    assert history[-1]["test_acc"] >= 0.9
    assert history[-1]["train_loss"] < history[0]["train_loss"] / 4
    assert history[-1]["test_samples"] == len(digits(seed=0).test) == 359  # every test sample once
    # the all-reduced accuracy equals one process scoring the whole split with the same weights
    assert history[-1]["test_acc"] == pytest.approx(_accuracy_in_one_process(results[0]["weights"]), abs=1e-9)
    for other in results[1:]:  # DDP kept the replicas identical; metrics agree on every rank
        assert other["history"] == history
        assert same_weights(other["weights"], results[0]["weights"])
    # rank 0 wrote once per epoch, the others never; one complete file, no temporary leftovers
    assert [r["checkpoints_written"] for r in results] == [4] + [0] * (world_size - 1)
    assert os.listdir(ckpt.parent) == ["digits.pt"]
    state = load_checkpoint(str(ckpt))
    assert state["epoch"] == 4 and same_weights(state["model"], results[0]["weights"])


def _steps_per_epoch(world_size: int, batch_size: int) -> int:
    """Each rank gets ceil(N / world_size) training samples and drops its last partial batch."""
    return math.ceil(len(digits(seed=0).train) / world_size) // batch_size


@pytest.mark.timeout(180)
def test_crash_and_restart_ends_with_the_uninterrupted_weights(tmp_path):
    ckpt = tmp_path / "restarted.pt"
    per_epoch, fail_at = _steps_per_epoch(2, TrainConfig().batch_size), 30
    assert per_epoch < fail_at <= 2 * per_epoch  # the crash comes in epoch 2, after one checkpoint
    # One thread per rank, as in the spawn reference below (torchrun() would share out the cores),
    # so both runs do the same float arithmetic and the results can be compared bitwise.
    run = torchrun("ddp_tutorial.training.train", 2, args=["--epochs", "2", "--checkpoint", ckpt, "--resume",
                                                  "--fail-at-step", fail_at], max_restarts=1, timeout=150,
                   env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert f"injected failure at step {fail_at} (attempt 0)" in run.output
    assert f"resumed from restarted.pt after epoch 1 (step {per_epoch}), attempt 1" in run.output
    assert run.output.count("no checkpoint yet") == 1  # the first attempt's only, not the resumed one's
    reference = spawn(train, 2, args=(TrainConfig(num_epochs=2, log=False),), threads=1, timeout=100)
    restarted = load_checkpoint(str(ckpt))
    assert restarted["epoch"] == 2 and restarted["step"] == reference[0]["steps"] == 2 * per_epoch
    assert same_weights(restarted["model"], reference[0]["weights"])  # bitwise
    assert restarted["history"] == reference[0]["history"]


@pytest.mark.slow  # make test stays under 12 minutes; make test-slow and CI run it
@pytest.mark.timeout(120)
def test_two_nodes_on_one_machine_form_one_world():
    nodes = multinode.simulate_nodes(nnodes=2, nproc_per_node=2, rendezvous="c10d", timeout=100)
    reports = [r for node in nodes for r in multinode.parse_reports(node.output)]
    assert [r["rank_from_group"] for r in reports] == [0, 1, 2, 3]
    for r in reports:
        assert int(r["WORLD_SIZE"]) == 4 and int(r["LOCAL_WORLD_SIZE"]) == 2
        assert int(r["RANK"]) == r["rank_from_group"]
        assert int(r["RANK"]) == int(r["GROUP_RANK"]) * 2 + int(r["LOCAL_RANK"])
    placed = sorted((int(r["GROUP_RANK"]), int(r["LOCAL_RANK"])) for r in reports)
    assert placed == [(0, 0), (0, 1), (1, 0), (1, 1)]


RESUMABLE = {"optimizer": {}, "rng": {}, "epoch": 1, "step": 1, "history": []}  # what build() reads besides


def _other_model_checkpoint(path) -> str:
    save_checkpoint({"model": ToyModel().state_dict(), "model_name": "resnet18", "dataset": "digits", **RESUMABLE},
                    str(path))
    return str(path)


def _wrong_shapes_checkpoint(path) -> str:
    save_checkpoint({"model": ToyModel().state_dict(), "model_name": "cnn", "dataset": "digits", **RESUMABLE},
                    str(path))
    return str(path)


def _truncated_checkpoint(path) -> str:
    save_checkpoint({"model": SmallCNN().state_dict(), "model_name": "cnn", "dataset": "digits", **RESUMABLE},
                    str(path))
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return str(path)


BAD_INPUTS = {
    "unknown dataset": (lambda tmp: ["--dataset", "mnist"], "invalid choice: 'mnist'"),
    "unknown model": (lambda tmp: ["--model", "vgg"], "invalid choice: 'vgg'"),
    "cifar without a data dir": (lambda tmp: ["--dataset", "cifar10"], "needs --data-dir"),
    "missing data dir": (lambda tmp: ["--dataset", "cifar10", "--data-dir", str(tmp / "nowhere")],
                         "does not exist"),
    "empty data dir": (lambda tmp: ["--dataset", "cifar10", "--data-dir", str(tmp)], "is empty"),
    "batch too large": (lambda tmp: ["--batch-size", "2000"], "leaves each of the 1 rank(s) without a full batch"),
    "no epochs": (lambda tmp: ["--epochs", "0"], "--epochs must be at least 1"),
    "other model's checkpoint": (lambda tmp: ["--resume", "--checkpoint", _other_model_checkpoint(tmp / "c.pt")],
                                 "saved with model_name='resnet18', but this run uses model_name='cnn'"),
    "checkpoint that does not fit": (
        lambda tmp: ["--resume", "--checkpoint", _wrong_shapes_checkpoint(tmp / "c.pt")], "does not fit model 'cnn'"),
    "half-written checkpoint": (lambda tmp: ["--resume", "--checkpoint", _truncated_checkpoint(tmp / "c.pt")],
                                "is damaged or not a checkpoint"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_is_one_line_and_a_nonzero_exit(case, tmp_path, capsys):
    make_argv, message = BAD_INPUTS[case]
    argv = make_argv(tmp_path) + ["--epochs", "1"] * (case != "no epochs")
    try:
        code = main(argv)
    except SystemExit as stop:  # argparse's errors
        code = stop.code
    err = capsys.readouterr().err
    assert code != 0
    assert message in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


@pytest.mark.slow  # make test stays under 12 minutes; make test-slow and CI run it
@pytest.mark.timeout(60)
def test_bad_input_exit_code_of_the_real_program(tmp_path):
    done = subprocess.run([sys.executable, "-m", "ddp_tutorial.training.train", "--dataset", "cifar10",
                           "--data-dir", str(tmp_path / "missing")], capture_output=True, text=True, timeout=50)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"ddp_tutorial.training.train: error: --data-dir {tmp_path / 'missing'} does not exist "
        "(add --download to fetch CIFAR-10 into it)"]


def test_a_crash_while_saving_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / "model.pt"
    save_checkpoint({"epoch": 1, "w": torch.ones(3)}, str(path))

    def dies_halfway(obj, f, *args, **kwargs):
        f.write(b"PK\x03\x04 half a zip")
        raise KeyboardInterrupt  # like Ctrl-C (or our SIGTERM handler) in the middle of torch.save

    monkeypatch.setattr(torch, "save", dies_halfway)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint({"epoch": 2, "w": torch.zeros(3)}, str(path))
    monkeypatch.undo()
    assert os.listdir(tmp_path) == ["model.pt"]
    state = load_checkpoint(str(path))
    assert state["epoch"] == 1 and torch.equal(state["w"], torch.ones(3))


class _NotATensor:
    pass


def test_loading_refuses_arbitrary_objects(tmp_path):
    path = tmp_path / "evil.pt"
    torch.save({"model": _NotATensor()}, path)
    with pytest.raises(CheckpointError, match="cannot load checkpoint"):
        load_checkpoint(str(path))


@pytest.mark.parametrize("n,world_size", [(359, 2), (359, 3), (5, 4), (2, 4)])
def test_test_shards_cover_every_sample_once(n, world_size):
    shards = [shard_indices(n, r, world_size) for r in range(world_size)]
    assert sorted(i for s in shards for i in s) == list(range(n))
    assert max(map(len, shards)) - min(map(len, shards)) <= 1


def test_fake_data_trains_alone_and_resnet18_fits_32x32(capsys):
    assert main(["--dataset", "fake", "--num-samples", "64", "--batch-size", "16", "--epochs", "1"]) == 0
    out = capsys.readouterr().out
    assert "epoch 1/1  step 4 " in out and "final test accuracy" in out and "8 test samples" in out
    from ddp_tutorial.models import build_model

    resnet = build_model("resnet18", 3, 10)
    assert resnet(torch.zeros(2, 3, 32, 32)).shape == (2, 10)
    assert resnet.conv1.stride == (1, 1)  # the CIFAR stem keeps 32x32 through the first block


@pytest.mark.slow  # a benchmark's test (make test-slow runs them)
@pytest.mark.timeout(120)
def test_bench_train_tiny_run_is_well_formed():
    import argparse

    from ddp_tutorial.bench import scaling as bench_train

    parser = argparse.ArgumentParser()
    bench_train.add_arguments(parser)
    result = bench_train.run(parser.parse_args(["--rounds", "1", "--steps", "2", "--repeat", "1",
                                                "--digits-batch-size", "32", "--fake-batch-size", "8",
                                                "--fake-samples", "64"]))
    rate = {(r["data"], r["processes"]): r["samples/s"] for r in result.rows}
    assert len(rate) == 6 and all(v > 0 for v in rate.values())
    assert all(0 < r["cpu/wall"] < 1.5 for r in result.rows)
    for data in ("digits", "fake 32x32"):
        assert result.ratios[f"{data}: throughput 2 procs / 1 proc"] == pytest.approx(
            rate[(data, "2 (DDP)")] / rate[(data, "1")])


@pytest.mark.slow  # make test stays under 12 minutes; make test-slow and CI run it
@pytest.mark.timeout(120)
def test_bad_input_under_torchrun_is_one_line_per_node_and_no_worker_traceback():
    run = torchrun("ddp_tutorial.training.train", 2, args=["--epochs", "0"], check=False, timeout=100)
    assert run.returncode != 0
    message = "python -m ddp_tutorial.training.train: error: --epochs must be at least 1"
    said = [line for line in run.output.splitlines() if message in line]
    assert len(said) == 1, run.output  # local rank 0 says it; local rank 1 fails silently
    # torchrun's summary: the first worker to fail left through argparse's exit 2 (an uncaught
    # exception would be 1); the other one did too, or torchrun stopped it with SIGTERM (-15) first
    summary = run.output.split("Failures:")[-1]
    assert re.search(r"Root Cause.*?exitcode\s+:\s+2 ", summary, re.S), run.output
    assert sorted(set(re.findall(r"exitcode\s+:\s+(-?\d+) ", summary))) in (["2"], ["-15", "2"]), run.output
    # torchrun prints a traceback of its own (ChildFailedError); the workers print none
    assert "ConfigError" not in run.output and "ddp_tutorial/training/train.py" not in run.output, run.output
    for block in run.output.split("Traceback (most recent call last):")[1:]:
        assert "torch.distributed.elastic.multiprocessing.errors.ChildFailedError" in block, run.output


def _trained_weights(tmp_path, name: str, *options: str) -> dict:
    """One process, one epoch of digits through main(); the final weights, read back from the checkpoint."""
    path = str(tmp_path / f"{name}.pt")
    assert main(["--epochs", "1", "--batch-size", "64", "--checkpoint", path, *options]) == 0
    state = load_checkpoint(path)
    assert state["step"] > 0  # it did take optimizer steps
    return state["model"]


@pytest.mark.timeout(60)
def test_seed_fixes_the_result_and_lr_zero_keeps_the_initial_weights(tmp_path, capsys):
    # Bitwise on a GPU too: main() leaves --deterministic unset, which means deterministic kernels
    # wherever the run trains on CUDA (deterministic_for); on the CPU they are deterministic already.
    first = _trained_weights(tmp_path, "first", "--seed", "3")
    again = _trained_weights(tmp_path, "again", "--seed", "3")
    other = _trained_weights(tmp_path, "other", "--seed", "4")
    frozen = _trained_weights(tmp_path, "frozen", "--seed", "3", "--lr", "0")
    assert same_weights(first, again)  # bitwise
    assert not same_weights(first, other, atol=1e-6)
    # The reference for "initial weights", built outside train(): torch's generator seeded by hand,
    # then the model. train.build() seeds, loads the data, builds the loaders, then the model; none
    # of the data steps draws from the global RNG (digits() splits with a private torch.Generator;
    # DistributedSampler and DataLoader draw nothing until iterated), checked here: the RNG state
    # after loading is the state right after seeding. SmallCNN has no buffers (no BatchNorm), so
    # with --lr 0 nothing in the state dict may move.
    seed_everything(3)
    after_seed = torch.get_rng_state()
    make_loaders(load_dataset("digits", seed=3), 64, 0, 1, seed=3)
    assert torch.equal(torch.get_rng_state(), after_seed)
    torch.manual_seed(3)
    initial = build_model("cnn", 1, 10).state_dict()
    assert not list(SmallCNN().buffers())
    assert same_weights(frozen, initial)  # bitwise
    assert not same_weights(first, initial, atol=1e-6)  # a real lr does move them: the reference is not trivial
    capsys.readouterr()


def test_cifar10_dir_without_the_dataset_is_one_line(tmp_path, capsys):
    (tmp_path / "junk.bin").write_bytes(b"not CIFAR-10")
    code = main(["--dataset", "cifar10", "--data-dir", str(tmp_path), "--epochs", "1"])
    err = capsys.readouterr().err
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert f"ddp_tutorial.training.train: error: no usable CIFAR-10 in {tmp_path} (" in err
    assert f"expected {tmp_path}/cifar-10-batches-py, or add --download" in err


@pytest.mark.timeout(60)
def test_cifar10_failed_download_stops_every_rank_with_rank0s_message(tmp_path):
    results = spawn(train_workers.cifar10_download, 2, args=(str(tmp_path / "cifar"), True), threads=1, timeout=30)
    messages = [message for message, _ in results]
    calls = [call for _, rank_calls in results for call in rank_calls]
    assert calls == [(0, True, False)]  # rank 0 tried once; rank 1 never touched torchvision
    expected = f"downloading CIFAR-10 into {tmp_path / 'cifar'} failed: OSError: offline"
    assert messages == [expected, expected]


@pytest.mark.timeout(60)
def test_cifar10_download_by_rank0_while_the_others_wait(tmp_path):
    results = spawn(train_workers.cifar10_download, 2, args=(str(tmp_path), False), threads=1, timeout=30)
    assert [message for message, _ in results] == [None, None]
    downloads = [(rank, done) for _, rank_calls in results for rank, download, done in rank_calls if download]
    loads = [(rank, done) for _, rank_calls in results for rank, download, done in rank_calls if not download]
    assert downloads == [(0, False), (0, False)]  # train and test split, rank 0 only
    assert loads == [(0, True), (0, True), (1, True), (1, True)]  # every rank read only after the download


@pytest.mark.parametrize("requested, device_type, expected", [
    (None, "cuda", True),    # unset on a GPU: deterministic, so lessons 09 and 11 can compare bitwise
    (None, "cpu", False),    # unset on the CPU: nothing to switch
    (True, "cpu", True), (False, "cuda", False), (True, "cuda", True),
])
def test_deterministic_unless_told_otherwise_on_a_gpu(requested, device_type, expected):
    assert deterministic_for(requested, device_type) is expected


def test_determinism_switches_are_set_both_ways():
    on, off = determinism_switches(True, cuda=True), determinism_switches(False, cuda=True)
    assert on == {"cudnn.benchmark": False, "cudnn.deterministic": True, "deterministic_algorithms": True,
                  "warn_only": True, "CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
    assert off == {"cudnn.benchmark": True, "cudnn.deterministic": False, "deterministic_algorithms": False,
                   "warn_only": True, "CUBLAS_WORKSPACE_CONFIG": None}
    # cuBLAS's workspace only matters where cuBLAS runs
    assert determinism_switches(True, cuda=False)["CUBLAS_WORKSPACE_CONFIG"] is None


def _flags() -> tuple:
    return (torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic,
            torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())


def test_seed_everything_false_undoes_true(monkeypatch):
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", "unset")
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG")  # restored to "absent" after the test
    try:
        seed_everything(0, deterministic=True, cuda=True)
        assert _flags() == (False, True, True, True)
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
        seed_everything(0, deterministic=False)
        assert _flags()[:3] == (True, False, False)
        seed_everything(0, deterministic=True, cuda=False)
        assert _flags() == (False, True, True, True)
    finally:
        seed_everything(0, deterministic=False)
        torch.backends.cudnn.benchmark = False  # torch's default, for the tests that follow


def test_deterministic_flag_on_the_command_line():
    parse = build_parser().parse_args
    assert parse([]).deterministic is None and TrainConfig().deterministic is None
    assert parse(["--deterministic"]).deterministic is True
    assert parse(["--no-deterministic"]).deterministic is False


def test_rank_0_shows_a_progress_bar_where_spawn_shows_it_live(monkeypatch):
    from ddp_tutorial.launch import spec
    from ddp_tutorial.training.train import progress

    monkeypatch.setenv(spec.LIVE_ENV, "1")  # what spawn sets in a rank whose output is watched
    bar = progress([1, 2, 3], 0, "epoch 1")
    assert not bar.disable and list(bar) == [1, 2, 3]
    assert progress([1, 2], 1, "epoch 1") == [1, 2]  # other ranks: no bar
    monkeypatch.delenv(spec.LIVE_ENV)
    assert progress([1], 0, "epoch 1").disable  # nbval, pytest, a pipe: nobody sees it move


@pytest.mark.timeout(120)
def test_ranks_follow_rank_0s_resume_decision(tmp_path):
    tw = train_workers
    # Only rank 0's node has the file: the others must not silently start from scratch.
    got = spawn(tw.resume_without_shared_storage, 3, args=(str(tmp_path / "a"), 0), timeout=60)
    assert got[0] is True
    assert all("cannot see" in g and "shared file system" in g and f"rank {r}" in g for r, g in enumerate(got) if r)
    # Only rank 1's node has one: rank 0 decides to start over, and so does everyone.
    assert spawn(tw.resume_without_shared_storage, 2, args=(str(tmp_path / "b"), 1), timeout=60) == [False, False]


def test_digits_are_sklearns_load_digits():
    """``digits`` reads scikit-learn's file itself; the reference is scikit-learn's own loader."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    spec = digits(seed=0)
    images = torch.cat([spec.train.tensors[0], spec.test.tensors[0]])
    labels = torch.cat([spec.train.tensors[1], spec.test.tensors[1]])
    order = torch.randperm(len(bunch.target), generator=torch.Generator().manual_seed(0))
    n_test = int(round(len(bunch.target) * 0.2))
    order = torch.cat([order[n_test:], order[:n_test]])  # train first, as concatenated above
    want = torch.tensor(bunch.images, dtype=torch.float32).unsqueeze(1)[order] / 16.0
    assert torch.equal(images, want) and torch.equal(labels, torch.tensor(bunch.target)[order])


def test_digits_leave_sklearn_unimported():
    """Every rank of every launch loads digits: without importing scikit-learn (it costs seconds)."""
    code = ("import sys; from ddp_tutorial.training.data import digits; digits(); "
            "from ddp_tutorial.training.reproducibility import seed_everything; seed_everything(0); "
            "print(sorted(m for m in ('sklearn', 'torch._inductor.config') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_digits_fall_back_to_sklearns_loader_where_its_file_moved(monkeypatch):
    """A scikit-learn that keeps digits.csv.gz elsewhere: the same data, through its own loader."""
    import ddp_tutorial.training.data as data

    direct = digits(seed=3)
    monkeypatch.setattr(data.os.path, "exists", lambda path: False)
    moved = data.digits(seed=3)
    for a, b in ((direct.train, moved.train), (direct.test, moved.test)):
        assert all(torch.equal(x, y) for x, y in zip(a.tensors, b.tensors))
