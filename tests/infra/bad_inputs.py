"""Every bad input of ``python -m ddp_tutorial.training.train`` (issue 38): the line it must print, its exit code.

``test_bad_inputs.py`` runs each as a real process (``make test-slow``) and asserts one line on
stderr holding ``says``, exit ``code``, no traceback, and no epoch trained. ``args`` gets a fresh
scratch folder, for the files a case needs.
"""

from __future__ import annotations

import datetime
import os
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from ddp_tutorial.models import SmallCNN, ToyModel
from ddp_tutorial.training.checkpoint import save_checkpoint


@dataclass(frozen=True)
class BadInput:
    name: str
    args: Callable[[Path], list[str]]
    says: str
    code: int = 2
    skip: str = ""  # why this machine cannot show it ("" where it can)


AS_ROOT = "root writes and reads whatever the mode bits say" if os.geteuid() == 0 else ""
RESUMABLE = {"optimizer": {}, "rng": {}, "epoch": 1, "step": 1, "history": []}


def _checkpoint(folder: Path, *, model: torch.nn.Module | None = None, model_name: str = "cnn",
                without: str = "") -> Path:
    """A checkpoint of SmallCNN on digits as save_checkpoint writes it (a different one on request)."""
    state = {"model": (model or SmallCNN(1, 10)).state_dict(), "model_name": model_name, "dataset": "digits",
             **RESUMABLE}
    state.pop(without, None)
    path = folder / "c.pt"
    save_checkpoint(state, str(path))
    return path


def _changed(folder: Path, change: Callable[[bytes], bytes]) -> list[str]:
    path = _checkpoint(folder)
    path.write_bytes(change(path.read_bytes()))
    return ["--resume", "--checkpoint", str(path)]


def _flip(data: bytes) -> bytes:
    position = len(data) // 3
    return data[:position] + bytes([data[position] ^ 0x10]) + data[position + 1:]


def _written(folder: Path, name: str, data: bytes | None = None, *, obj: object = None, mode: int | None = None) -> str:
    path = folder / name
    if data is not None:
        path.write_bytes(data)
    else:
        torch.save(obj, path)
    if mode is not None:
        os.chmod(path, mode)
    return str(path)


def _folder(folder: Path, mode: int) -> str:
    (folder / "locked").mkdir(mode=mode)
    return str(folder / "locked" / "c.pt")


def _resume(path: str) -> list[str]:
    return ["--resume", "--checkpoint", path]


NOISE = bytes(random.Random(0).randrange(256) for _ in range(5000))

CASES = [
    # options: argparse-level, before any process group or data
    BadInput("--stop-on-signal BOGUS", lambda d: ["--stop-on-signal", "BOGUS", "--checkpoint", str(d / "c.pt")],
             "--stop-on-signal BOGUS: unknown signal 'BOGUS': use names like USR1, USR2 or TERM"),
    BadInput("--stop-on-signal KILL", lambda d: ["--stop-on-signal", "KILL", "--checkpoint", str(d / "c.pt")],
             "SIGKILL cannot be caught"),
    BadInput("--stop-on-signal USR1,STOP", lambda d: ["--stop-on-signal", "USR1,STOP", "--checkpoint",
                                                       str(d / "c.pt")], "SIGSTOP cannot be caught"),
    BadInput("--stop-on-signal _DFL (a module attribute, not a signal)",
             lambda d: ["--stop-on-signal", "_DFL", "--checkpoint", str(d / "c.pt")], "unknown signal '_DFL'"),
    BadInput("--stop-on-signal ','", lambda d: ["--stop-on-signal", ",", "--checkpoint", str(d / "c.pt")],
             "--stop-on-signal needs a signal name"),
    BadInput("--stop-on-signal without --checkpoint", lambda d: ["--stop-on-signal", "USR1"],
             "--stop-on-signal needs --checkpoint PATH"),
    BadInput("--resume without --checkpoint", lambda d: ["--resume"], "--resume needs --checkpoint PATH"),
    BadInput("--checkpoint ''", lambda d: ["--checkpoint", ""], "--checkpoint needs a file path"),
    BadInput("--workers -1", lambda d: ["--workers", "-1"], "--workers must be at least 0, got -1"),
    BadInput("--dataset fake --image-size 1", lambda d: ["--dataset", "fake", "--image-size", "1"],
             "--image-size must be at least 2, got 1"),
    BadInput("--dataset fake --num-samples 0", lambda d: ["--dataset", "fake", "--num-samples", "0"],
             "--num-samples must be at least 1, got 0"),
    BadInput("--dataset fake, 64 GiB of images", lambda d: ["--dataset", "fake", "--image-size", "4096"],
             "GiB of memory; use fewer or smaller"),
    BadInput("--epochs 0", lambda d: ["--epochs", "0"], "--epochs must be at least 1, got 0"),
    BadInput("--epochs two", lambda d: ["--epochs", "two"], "argument --epochs: invalid int value: 'two'"),
    BadInput("--lr nan", lambda d: ["--lr", "nan"], "--lr must be a finite number of at least 0, got nan"),
    BadInput("--lr -1", lambda d: ["--lr", "-1"], "--lr must be a finite number of at least 0, got -1.0"),
    BadInput("--momentum -0.5", lambda d: ["--momentum", "-0.5"], "--momentum must be at least 0 and below 1"),
    BadInput("--momentum inf", lambda d: ["--momentum", "inf"], "--momentum must be at least 0 and below 1"),
    BadInput("--seed -1", lambda d: ["--seed", "-1"], "--seed must be from 0 to 2**63 - 1, got -1"),
    BadInput("--fail-at-step 0", lambda d: ["--fail-at-step", "0"], "--fail-at-step must be at least 1, got 0"),
    BadInput("--dataset mnist", lambda d: ["--dataset", "mnist"], "invalid choice: 'mnist'"),
    BadInput("--model vgg", lambda d: ["--model", "vgg"], "invalid choice: 'vgg'"),
    BadInput("an unknown option", lambda d: ["--epocs", "3"], "unrecognized arguments: --epocs 3"),
    # the checkpoint's path: checked before training, so no epoch is lost to it
    BadInput("--checkpoint DIRECTORY", lambda d: ["--checkpoint", str(d)], "it is a directory; give a file path"),
    BadInput("--checkpoint /dev/null/x", lambda d: ["--checkpoint", "/dev/null/x"], "/dev/null is not a folder"),
    BadInput("--checkpoint /dev/null", lambda d: ["--checkpoint", "/dev/null"], "exists and is not a regular file"),
    BadInput("--checkpoint under a file", lambda d: ["--checkpoint", _written(d, "file", b"") + "/c.pt"],
             "/file is not a folder"),
    BadInput("--checkpoint in /sys (not writable, even by root)", lambda d: ["--checkpoint", "/sys/c.pt"],
             "cannot write checkpoint /sys/c.pt: Permission denied", skip="" if os.path.isdir("/sys") else "no /sys"),
    BadInput("--checkpoint in a read-only folder", lambda d: ["--checkpoint", _folder(d, 0o555)],
             "Permission denied; choose a folder you can write to", skip=AS_ROOT),
    # data: found once the data is loaded, still before the first step
    BadInput("--dataset cifar10 without --data-dir", lambda d: ["--dataset", "cifar10"], "needs --data-dir DIR"),
    BadInput("--data-dir missing", lambda d: ["--dataset", "cifar10", "--data-dir", str(d / "no")], "does not exist"),
    BadInput("--batch-size 0", lambda d: ["--batch-size", "0"], "--batch-size must be at least 1, got 0"),
    BadInput("--batch-size larger than the data", lambda d: ["--batch-size", "5000"], "without a full batch"),
    # --resume: every damaged or foreign checkpoint refused in one line naming it
    BadInput("resume from random bytes", lambda d: _resume(_written(d, "c.pt", NOISE)), "is damaged or not a checkpoint"),
    BadInput("resume from a directory", lambda d: _resume(str(d)), "it is a directory; give a file path"),
    BadInput("resume from an empty file", lambda d: _resume(_written(d, "c.pt", b"")), "is empty"),
    BadInput("resume from a truncated checkpoint", lambda d: _changed(d, lambda b: b[: len(b) * 2 // 3]),
             "is damaged or not a checkpoint"),
    BadInput("resume from a checkpoint with a flipped bit", lambda d: _changed(d, _flip),
             "its SHA-256 does not match its contents"),
    BadInput("resume from a checkpoint without 'optimizer'", lambda d: _resume(str(_checkpoint(d, without="optimizer"))),
             "has no 'optimizer'"),
    BadInput("resume from a checkpoint without 'model'", lambda d: _resume(str(_checkpoint(d, without="model"))),
             "has no 'model'"),
    BadInput("resume from another model's checkpoint",
             lambda d: _resume(str(_checkpoint(d, model=ToyModel(), model_name="resnet18"))),
             "saved with model_name='resnet18', but this run uses model_name='cnn'"),
    BadInput("resume from a checkpoint that does not fit", lambda d: _resume(str(_checkpoint(d, model=ToyModel()))),
             "does not fit model 'cnn'"),
    BadInput("resume from a file holding a list", lambda d: _resume(_written(d, "c.pt", obj=[1, 2])),
             "is not a training checkpoint (it holds a list)"),
    BadInput("resume from a pickle weights_only refuses", lambda d: _resume(_written(d, "c.pt", obj={
        "model": datetime.date(2020, 1, 1)})), "cannot load checkpoint"),
    BadInput("resume from an unreadable file", lambda d: _resume(_written(d, "c.pt", b"x", mode=0)),
             "cannot read checkpoint", skip=AS_ROOT),
]
