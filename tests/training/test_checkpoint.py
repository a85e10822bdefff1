"""Checkpoint files: every damaged or foreign file refused in one line, and how they are written.

Covers ``ddp_tutorial.training.checkpoint`` and ``ddp_tutorial.training.checkpoint_file``, in this
process (no subprocess): make test runs them, in a few seconds.
"""

from __future__ import annotations

import os
import random
import socket
import stat

import pytest
import torch

from ddp_tutorial.models import SmallCNN
from ddp_tutorial.training.checkpoint import CheckpointError, load_checkpoint, same_weights, save_checkpoint
from ddp_tutorial.training.checkpoint_file import check_writable, temporary_name
from ddp_tutorial.training.train import RESUME_KEYS

DEAD_PID = 2**22 + 1  # above Linux's largest pid_max (and macOS's): never a live process


@pytest.fixture(scope="module")
def training_state() -> dict:
    """A checkpoint as train.epoch_state writes it, small: SmallCNN, SGD's momentum, an RNG state.

    The optimizer's state dict is written out by hand: building a torch.optim.SGD imports
    torch._dynamo, seconds that this file's tests do not need.
    """
    torch.manual_seed(0)
    model = SmallCNN(1, 10)
    params = list(model.parameters())
    optimizer = {"state": {i: {"momentum_buffer": torch.randn_like(p)} for i, p in enumerate(params)},
                 "param_groups": [{"lr": 0.1, "momentum": 0.9, "params": list(range(len(params)))}]}
    return {"model": model.state_dict(), "optimizer": optimizer, "epoch": 1, "step": 7,
            "rng": {"torch": torch.get_rng_state()}, "history": [{"epoch": 1, "train_loss": 2.0}],
            "model_name": "cnn", "dataset": "digits", "world_size": 2, "world_sizes": [2]}


@pytest.fixture(scope="module")
def sealed(tmp_path_factory, training_state) -> bytes:
    path = tmp_path_factory.mktemp("sealed") / "good.pt"
    save_checkpoint(training_state, str(path))
    return path.read_bytes()


def _refused(path, expect: str = "") -> str:
    with pytest.raises(CheckpointError) as caught:
        load_checkpoint(str(path), require=RESUME_KEYS)
    message = str(caught.value)
    assert len(message.splitlines()) == 1 and str(path) in message and expect in message, message
    return message


def _spread(length: int, count: int) -> list[int]:
    return sorted({round(i * (length - 1) / (count - 1)) for i in range(count)})


def test_a_sealed_checkpoint_round_trips_and_torch_load_still_reads_it(tmp_path, sealed, training_state):
    path = tmp_path / "c.pt"
    path.write_bytes(sealed)
    state = load_checkpoint(str(path), require=RESUME_KEYS, expect={"model_name": "cnn"})
    assert same_weights(state["model"], training_state["model"]) and state["step"] == 7
    assert torch.load(path, weights_only=True)["epoch"] == 1  # a plain torch.load needs nothing new


def test_truncations_at_50_offsets_are_refused(tmp_path, sealed):
    path = tmp_path / "cut.pt"
    for offset in _spread(len(sealed), 50):  # 0 (an empty file) up to one byte short
        path.write_bytes(sealed[:offset])
        _refused(path)


def test_50_single_bit_flips_are_refused(tmp_path, sealed):
    path = tmp_path / "flipped.pt"
    positions = _spread(len(sealed), 40) + list(range(len(sealed) - 110, len(sealed), 11))  # and the trailer
    for position in positions:
        damaged = bytearray(sealed)
        damaged[position] ^= 1 << (position % 8)
        path.write_bytes(bytes(damaged))
        _refused(path)
    assert len(positions) == 50


def test_random_bytes_and_foreign_files_are_refused(tmp_path):
    path = tmp_path / "noise.pt"
    rng = random.Random(0)
    for size in (1, 21, 22, 100, 4096, 100_000):
        path.write_bytes(bytes(rng.randrange(256) for _ in range(size)))
        _refused(path)
    path.write_bytes(b"PK\x03\x04" + bytes(rng.randrange(256) for _ in range(500)))  # a zip's start, then noise
    _refused(path)
    torch.save([1, 2, 3], path)
    _refused(path, "not a training checkpoint (it holds a list)")


def test_a_directory_and_a_missing_file_are_refused(tmp_path):
    _refused(tmp_path, "is a directory")
    _refused(tmp_path / "nowhere.pt", "no checkpoint at")


@pytest.mark.parametrize("key", ["model", "optimizer", "rng", "epoch", "model_name"])
def test_a_missing_key_is_refused(tmp_path, key, training_state):
    state = {name: value for name, value in training_state.items() if name != key}
    save_checkpoint(state, str(tmp_path / "c.pt"))
    _refused(tmp_path / "c.pt", f"has no {key!r}")


def test_a_checkpoint_written_before_the_checksum_still_loads(tmp_path, training_state):
    path = tmp_path / "old.pt"
    torch.save(training_state, path)  # what save_checkpoint wrote before the checksum
    assert load_checkpoint(str(path), require=RESUME_KEYS)["step"] == 7


def test_loading_uses_weights_only(tmp_path, monkeypatch, sealed):
    path = tmp_path / "c.pt"
    path.write_bytes(sealed)
    seen = []
    load = torch.load
    monkeypatch.setattr(torch, "load", lambda *a, **k: seen.append(k.get("weights_only")) or load(*a, **k))
    load_checkpoint(str(path))
    assert seen == [True]


def test_the_file_has_the_usual_mode_and_the_folder_is_fsynced(tmp_path, monkeypatch):
    synced = []
    fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(stat.S_ISDIR(os.fstat(fd).st_mode)) or fsync(fd))
    old = os.umask(0o022)
    try:
        save_checkpoint({"epoch": 1}, str(tmp_path / "c.pt"))
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "c.pt").st_mode) == 0o644  # not mkstemp's 0600
    assert synced == [False, True]  # the file's bytes, then the folder's new name


def test_a_run_removes_its_dead_predecessors_temporary_files_only(tmp_path):
    path = tmp_path / "model.pt"
    host = socket.gethostname()
    dead = tmp_path / f"model.pt.{host}.{DEAD_PID}.0123abcd.tmp"  # a writer SIGKILLed mid-write
    live = tmp_path / f"model.pt.{host}.{os.getppid()}.89abcdef.tmp"  # another run, saving right now
    elsewhere = tmp_path / f"model.pt.other-node.{DEAD_PID}.0123abcd.tmp"  # a run on another host
    for leftover in (dead, live, elsewhere):
        leftover.write_bytes(b"half a checkpoint")
    save_checkpoint({"epoch": 1}, str(path))
    assert sorted(os.listdir(tmp_path)) == sorted(["model.pt", live.name, elsewhere.name])
    assert temporary_name(str(path)) != temporary_name(str(path))  # unique within a process too


def test_a_save_that_cannot_write_is_one_line_and_keeps_nothing(tmp_path):
    (tmp_path / "file").write_bytes(b"a file, not a folder")
    with pytest.raises(CheckpointError, match=r"^cannot write checkpoint .*file/c\.pt: .*/file is not a folder"):
        save_checkpoint({"epoch": 1}, str(tmp_path / "file" / "c.pt"))
    assert os.listdir(tmp_path) == ["file"]


@pytest.mark.parametrize("where, expect", [
    ("folder", "it is a directory; give a file path such as"),
    ("file/c.pt", "is not a folder"),
    ("/dev/null/x", "/dev/null is not a folder"),
    ("/dev/null", "it exists and is not a regular file"),
])
def test_an_unwritable_checkpoint_path_is_refused_before_training(tmp_path, where, expect):
    (tmp_path / "folder").mkdir()
    (tmp_path / "file").write_bytes(b"")
    path = where if where.startswith("/") else str(tmp_path / where)
    with pytest.raises(CheckpointError, match="cannot write checkpoint") as caught:
        check_writable(path)
    assert expect in str(caught.value) and len(str(caught.value).splitlines()) == 1


def test_a_writable_path_is_checked_without_leaving_anything(tmp_path):
    check_writable(str(tmp_path / "new" / "model.pt"))
    assert os.listdir(tmp_path / "new") == []
