"""Every bad input of the course's command lines (issue 38): the line it must print, its exit code.

``test_bad_inputs.py`` runs each as a real process (``make test-slow``): ``python -m COMMAND ARGS``,
or under torchrun with ``nproc`` processes, and asserts one line on stderr holding ``says`` (under
torchrun: said once in the whole output), exit ``code``, no traceback, and no work done (training:
no epoch; the others: nothing on stdout). ``args`` gets a fresh scratch folder, for the files a
case needs. The commands: ``training.train`` (the default), ``exercises check``, ``bench``,
``capstone.composed``, ``tensor_parallel.split_mlp`` and the lessons' other torchrun modules.
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

TRAIN = ("ddp_tutorial.training.train", "--epochs", "1")
CHECK = ("ddp_tutorial.exercises", "check", "scatter_p2p")
BENCH = ("ddp_tutorial.bench",)
COMPOSED = ("ddp_tutorial.capstone.composed",)
SPLIT_MLP = ("ddp_tutorial.tensor_parallel.split_mlp",)
MODEL_PARALLEL = ("ddp_tutorial.pipeline_parallel.model_parallel",)
PIPELINE_GRID = ("ddp_tutorial.pipeline_parallel.pipeline_grid",)
DISPATCH = ("ddp_tutorial.expert_parallel.dispatch",)
EP_DP = ("ddp_tutorial.expert_parallel.ep_dp",)
DEVICE_MESH = ("ddp_tutorial.tensor_parallel.device_mesh",)
P2P = ("ddp_tutorial.comm.p2p",)
TORCH_CP = ("ddp_tutorial.context_parallel.torch_cp",)


@dataclass(frozen=True)
class BadInput:
    name: str
    args: Callable[[Path], list[str]]
    says: str
    code: int = 2
    skip: str = ""  # why this machine cannot show it ("" where it can)
    command: tuple[str, ...] = TRAIN  # the module, and the arguments every case of it starts with
    nproc: int = 0  # 0: python -m alone; else under torchrun with this many processes


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
    # python -m ddp_tutorial.exercises check: refused before any rank starts
    BadInput("check --timeout 0", lambda d: ["--timeout", "0"],
             "--timeout must be a positive number of seconds, got 0", command=CHECK),
    BadInput("check --timeout nan", lambda d: ["--timeout", "nan"],
             "--timeout must be a positive number of seconds, got nan", command=CHECK),
    BadInput("check --timeout -5", lambda d: ["--timeout", "-5"],
             "--timeout must be a positive number of seconds, got -5", command=CHECK),
    BadInput("check --file not UTF-8", lambda d: ["--file", _written(d, "mine.py", 'x = "\xe9"\n'.encode("latin-1"))],
             "is not UTF-8 text (byte 0xe9 at position 5): save it as UTF-8", command=CHECK),
    BadInput("check --file missing", lambda d: ["--file", str(d / "mine.py")], "error: no file", command=CHECK),
    BadInput("check --file a folder", lambda d: ["--file", str(d)],
             "is a folder; give the Python file that defines the exercise's function", command=CHECK),
    # python -m ddp_tutorial.bench: every number and output path checked before the first benchmark
    BadInput("bench launch --repeat 0", lambda d: ["launch", "--repeat", "0"],
             "argument --repeat: must be at least 1, got 0", command=BENCH),
    BadInput("bench launch --world-size 0", lambda d: ["launch", "--world-size", "0"],
             "argument --world-size: must be at least 1, got 0", command=BENCH),
    BadInput("bench launch --world-size -2", lambda d: ["launch", "--world-size", "-2"],
             "argument --world-size: must be at least 1, got -2", command=BENCH),
    BadInput("bench collectives --world-sizes 2 0", lambda d: ["collectives", "--world-sizes", "2", "0"],
             "argument --world-sizes: must be at least 1, got 0", command=BENCH),
    BadInput("bench ddp --bucket-cap-mb nan", lambda d: ["ddp", "--bucket-cap-mb", "nan"],
             "argument --bucket-cap-mb: must be a positive finite number, got nan", command=BENCH),
    BadInput("bench pipeline --forward-ms 0", lambda d: ["pipeline", "--schedules", "--forward-ms", "0"],
             "argument --forward-ms: must be a positive finite number, got 0", command=BENCH),
    BadInput("bench train --steps 0", lambda d: ["train", "--steps", "0"],
             "argument --steps: must be at least 1, got 0", command=BENCH),
    BadInput("bench launch --json in a missing folder", lambda d: ["launch", "--json", str(d / "no" / "r.json")],
             "/no does not exist; create it first", command=BENCH),
    BadInput("bench launch --json DIRECTORY", lambda d: ["launch", "--json", str(d)],
             "cannot write it: it is a folder; give a file path", command=BENCH),
    BadInput("bench launch --json /dev/null/x", lambda d: ["launch", "--json", "/dev/null/x"],
             "--json /dev/null/x: cannot write it: /dev/null is not a folder", command=BENCH),
    BadInput("bench all --json /dev/null/x", lambda d: ["all", "--json", "/dev/null/x"],
             "--json /dev/null/x: cannot write it: /dev/null is not a folder", command=BENCH),
    BadInput("bench launch --machine /dev/null/x", lambda d: ["launch", "--machine", "/dev/null/x"],
             "--machine /dev/null/x: cannot write it", command=BENCH),
    BadInput("bench launch --plot in a read-only folder", lambda d: ["launch", "--plot", _folder(d, 0o555)],
             "Permission denied; choose a path you can write to", command=BENCH, skip=AS_ROOT),
    # python -m ddp_tutorial.capstone.composed: sizes and layout, before torch loads or any group
    BadInput("composed --steps 0", lambda d: ["--steps", "0"], "--steps must be at least 1, got 0", command=COMPOSED),
    BadInput("composed --dp 0", lambda d: ["--dp", "0"], "--dp must be at least 1, got 0", command=COMPOSED),
    BadInput("composed --tp -1", lambda d: ["--tp", "-1"], "--tp must be at least 1, got -1", command=COMPOSED),
    BadInput("composed --pp 0", lambda d: ["--pp", "0"], "--pp must be at least 1, got 0", command=COMPOSED),
    BadInput("composed --cp 0", lambda d: ["--cp", "0"], "--cp must be at least 1, got 0", command=COMPOSED),
    BadInput("layout --tp 0", lambda d: ["--tp", "0"], "--tp must be at least 1, got 0",
             command=("ddp_tutorial.capstone.layout",)),
    BadInput("composed --dp 2 on one process", lambda d: ["--dp", "2"],
             "layout dp2: dp x tp x pp x cp = 2, but the world has 1 ranks", command=COMPOSED),
    BadInput("composed --tp 3 (4 heads)", lambda d: ["--tp", "3"],
             "tp=3 does not divide the 4 attention heads", command=COMPOSED),
    BadInput("composed --tp 3 under torchrun", lambda d: ["--tp", "3"],
             "dp x tp x pp x cp = 3, but the world has 2 ranks", command=COMPOSED, nproc=2),
    # python -m ddp_tutorial.tensor_parallel.split_mlp
    BadInput("split_mlp --hidden 0", lambda d: ["--hidden", "0"], "--hidden must be at least 1, got 0", command=SPLIT_MLP),
    BadInput("split_mlp --batch-size 0", lambda d: ["--batch-size", "0"], "--batch-size must be at least 1, got 0",
             command=SPLIT_MLP),
    BadInput("split_mlp --hidden 7 under torchrun", lambda d: ["--hidden", "7"],
             "7 units do not split evenly over 2 ranks; choose --hidden a multiple", command=SPLIT_MLP, nproc=2),
    # the lessons' other torchrun modules: a world they cannot use, refused from WORLD_SIZE before the ranks meet
    BadInput("model_parallel --batch-size 0 under torchrun", lambda d: ["--batch-size", "0"],
             "--batch-size must be at least 1, got 0", command=MODEL_PARALLEL, nproc=2),
    BadInput("pipeline_grid alone", lambda d: [], "a grid of 2 pipeline stages cannot cover world_size=1",
             command=PIPELINE_GRID),
    BadInput("pipeline_grid under torchrun with 3", lambda d: [],
             "a grid of 2 pipeline stages cannot cover world_size=3", command=PIPELINE_GRID, nproc=3),
    BadInput("pipeline_grid --num-micro 0", lambda d: ["--num-micro", "0"], "--num-micro must be at least 1, got 0",
             command=PIPELINE_GRID),
    BadInput("dispatch under torchrun with 3", lambda d: [],
             "4 experts do not split evenly over 3 ranks; choose --experts a multiple", command=DISPATCH, nproc=3),
    BadInput("dispatch --top-k 5", lambda d: ["--top-k", "5"], "--top-k 5 chooses more experts than there are",
             command=DISPATCH),
    BadInput("ep_dp under torchrun with 3", lambda d: [],
             "an expert-parallel size of 2 does not divide world_size=3", command=EP_DP, nproc=3),
    BadInput("device_mesh under torchrun with 3", lambda d: [],
             "8 units do not split evenly over 3 ranks; start it with torchrun", command=DEVICE_MESH, nproc=3),
    BadInput("device_mesh --tp-size 3", lambda d: ["--tp-size", "3"],
             "a tensor-parallel size of 3 does not divide world_size=1", command=DEVICE_MESH),
    BadInput("p2p alone", lambda d: [], "needs at least 2 ranks (a message needs a receiver), got 1", command=P2P),
    BadInput("torch_cp under torchrun with 3", lambda d: [],
             "a sequence of 64 does not split into 2 chunks per rank over 3 ranks", command=TORCH_CP, nproc=3),
]
