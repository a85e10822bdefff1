"""The options of ``python -m ddp_tutorial.training.train``: ``TrainConfig``, its rules, its command line.

Used by ``train`` (``11_train_end_to_end`` builds a ``TrainConfig`` for ``launch.spawn``;
``09_torchrun`` and ``16_cluster`` pass these options to torchrun and srun). Every rule on the
options lives in ``check_config``, checked before any process group or data: a bad option
is one line and exit 2, said once per node (local rank 0), never once per rank
(``launch.errors``: ``report``, ``UsageParser``; ``speaks_for_node`` and ``report`` are re-exported here).
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

from ddp_tutorial.launch.errors import UsageParser, report, speaks_for_node
from ddp_tutorial.models import TRAIN_MODELS
from ddp_tutorial.training.data import DATASETS
from ddp_tutorial.training.preemption import PREEMPTED_EXIT_CODE, signal_names

__all__ = ["TrainConfig", "ConfigError", "check_config", "default_model", "build_parser", "parse_config",
           "speaks_for_node", "report"]

DEFAULT_MODEL = {"digits": "cnn", "fake": "cnn", "cifar10": "resnet18"}
MIN_IMAGE_SIZE = 2  # SmallCNN's 2x2 max-pool needs two pixels a side
MAX_FAKE_BYTES = 4 * 2**30  # fake images are made in memory at once: 3 * size**2 float32 each


class ConfigError(ValueError):
    """A bad option (unknown model, no epochs): a one-line message."""


@dataclass
class TrainConfig:
    """Everything ``python -m ddp_tutorial.training.train`` accepts; the defaults reach >= 0.95 on digits."""

    dataset: str = "digits"
    data_dir: str | None = None
    download: bool = False
    model: str | None = None  # None: the dataset's usual model (DEFAULT_MODEL)
    num_epochs: int = 8
    batch_size: int = 32  # per process: the global batch is batch_size * world_size
    lr: float = 0.05
    momentum: float = 0.9
    seed: int = 0
    checkpoint: str | None = None
    resume: bool = False
    fail_at_step: int | None = None
    num_samples: int = 2048  # fake data only
    image_size: int = 32  # fake data only
    workers: int = 0  # DataLoader worker processes per rank
    deterministic: bool | None = None  # None: on a GPU, so runs repeat bitwise (lessons 09, 11); see deterministic_for
    stop_on_signal: str | None = None  # "USR1": stop after the epoch; "USR1,TERM": TERM after the step (16_cluster)
    log: bool = True


def default_model(dataset: str) -> str:
    return DEFAULT_MODEL.get(dataset, "cnn")


def check_config(config: TrainConfig) -> None:
    """Every rule on the options, checked before any process group or data: a one-line ``ConfigError``.

    ``main`` turns it into a usage error (exit 2) before torchrun's ranks meet; ``train`` checks again
    for callers that build a ``TrainConfig`` themselves (``launch.spawn`` in ``11_train_end_to_end``).
    """
    at_least = {"--epochs": (config.num_epochs, 1), "--num-samples": (config.num_samples, 1),
                "--image-size": (config.image_size, MIN_IMAGE_SIZE), "--workers": (config.workers, 0),
                "--fail-at-step": (config.fail_at_step if config.fail_at_step is not None else 1, 1)}
    for option, (value, least) in at_least.items():
        if value < least:
            raise ConfigError(f"{option} must be at least {least}, got {value}")
    if 3 * 4 * config.image_size ** 2 * (config.num_samples + config.num_samples // 8) > MAX_FAKE_BYTES:
        raise ConfigError(f"--num-samples {config.num_samples} fake images of {config.image_size}x"
                          f"{config.image_size} would take over {MAX_FAKE_BYTES // 2**30} GiB of memory; use fewer or smaller")
    if not (math.isfinite(config.lr) and config.lr >= 0):
        raise ConfigError(f"--lr must be a finite number of at least 0, got {config.lr}")
    if not (math.isfinite(config.momentum) and 0 <= config.momentum < 1):
        raise ConfigError(f"--momentum must be at least 0 and below 1, got {config.momentum}")
    if not 0 <= config.seed < 2**63:
        raise ConfigError(f"--seed must be from 0 to 2**63 - 1, got {config.seed}")
    model_name = config.model or default_model(config.dataset)
    if model_name not in TRAIN_MODELS:
        raise ConfigError(f"unknown model {model_name!r}; choose one of {', '.join(TRAIN_MODELS)}")
    if config.checkpoint == "":
        raise ConfigError("--checkpoint needs a file path, such as ckpt/model.pt")
    if config.stop_on_signal is not None:
        try:
            names = signal_names(config.stop_on_signal)
        except ValueError as exc:
            raise ConfigError(f"--stop-on-signal {config.stop_on_signal}: {exc}") from None
        if not names:
            raise ConfigError("--stop-on-signal needs a signal name, such as USR1 or USR1,TERM")
    for option, given in (("--resume", config.resume), ("--stop-on-signal", config.stop_on_signal)):
        if given and not config.checkpoint:
            raise ConfigError(f"{option} needs --checkpoint PATH: the file to resume from and to save to")


def build_parser() -> argparse.ArgumentParser:
    d = TrainConfig()
    p = UsageParser(prog="python -m ddp_tutorial.training.train",
                description="End-to-end DDP training: one program that runs alone, under torchrun, or from a notebook.")
    p.add_argument("--dataset", choices=DATASETS, default=d.dataset)
    p.add_argument("--data-dir", default=d.data_dir, help="folder of the cifar10 data")
    p.add_argument("--download", action="store_true",
                   help="cifar10: download into --data-dir (local rank 0 first)")
    p.add_argument("--model", choices=TRAIN_MODELS, default=None,
                   help="default: cnn for digits and fake, resnet18 for cifar10")
    p.add_argument("--epochs", dest="num_epochs", type=int, default=d.num_epochs, metavar="N")
    p.add_argument("--batch-size", type=int, default=d.batch_size, help="per process")
    p.add_argument("--lr", type=float, default=d.lr)
    p.add_argument("--momentum", type=float, default=d.momentum)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--checkpoint", metavar="PATH", help="written by rank 0 after every epoch")
    p.add_argument("--resume", action="store_true", help="continue from --checkpoint when it exists")
    p.add_argument("--fail-at-step", type=int, metavar="N", help="the last rank crashes at step N (first attempt)")
    p.add_argument("--num-samples", type=int, default=d.num_samples, help="fake: training images")
    p.add_argument("--image-size", type=int, default=d.image_size, help="fake: image side")
    p.add_argument("--workers", type=int, default=d.workers, help="DataLoader workers per process")
    p.add_argument("--deterministic", action=argparse.BooleanOptionalAction, default=d.deterministic,
                   help="deterministic cuDNN/cuBLAS kernels (default: on a GPU)")
    p.add_argument("--stop-on-signal", metavar="SIG[,SIG]", help="USR1 (Slurm's --signal): finish the epoch; "
                   "TERM (preemption, the time limit): finish the step; then checkpoint and exit "
                   f"{PREEMPTED_EXIT_CODE} so the job script requeues")
    return p


def parse_config(argv: list[str] | None = None) -> TrainConfig:
    """The command line as a checked ``TrainConfig``; a bad option exits 2 with one line, before any work."""
    parser = build_parser()
    config = TrainConfig(**vars(parser.parse_args(argv)))
    try:
        check_config(config)
    except ConfigError as exc:
        parser.error(str(exc))
    return config
