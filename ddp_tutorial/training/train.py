"""End-to-end DDP training: one program that runs alone, under torchrun, or from a notebook.

Used by ``11_train_end_to_end`` (through ``launch.spawn``), ``09_torchrun`` (fault
tolerance) and ``python -m ddp_tutorial.bench train``. From a shell:

    python -m ddp_tutorial.training.train                              # one process, digits
    torchrun --nproc-per-node=2 -m ddp_tutorial.training.train         # two processes
    torchrun --nproc-per-node=2 --max-restarts=1 -m ddp_tutorial.training.train \\
        --checkpoint ckpt/digits.pt --resume --fail-at-step 30   # crash once, restart, resume
    torchrun --nproc-per-node=2 -m ddp_tutorial.training.train --dataset cifar10 --data-dir data [--download]
    srun python -m ddp_tutorial.cluster.jobs ddp_tutorial.training.train --checkpoint ckpt.pt --resume \\
        --stop-on-signal USR1,TERM                             # in a Slurm job: stop, requeue, resume (16_cluster)

Every rank builds the same model from the same seed, trains on its own share of
the data (``DistributedSampler``), and DDP averages the gradients; metrics are
all-reduced so every test sample counts once. Rank 0 alone logs, shows a
progress bar (on a terminal) and writes the checkpoint after every epoch.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader

from ddp_tutorial.env import NotLaunchedError, distributed, rank_info
from ddp_tutorial.launch import watched_live
from ddp_tutorial.launch.errors import INTERRUPTED_EXIT_CODE, peer_lost, peer_lost_line  # 130: every Ctrl-C
from ddp_tutorial.models import build_model
from ddp_tutorial.training.checkpoint import (
    CheckpointError,
    agree_to_resume,
    capture_rng,
    load_checkpoint,
    restore_rng,
    save_checkpoint,
)
from ddp_tutorial.training.checkpoint_file import check_writable
from ddp_tutorial.training.data import DataError, load_dataset, make_loaders
from ddp_tutorial.training.evaluation import evaluate
from ddp_tutorial.training.options import (
    ConfigError,
    TrainConfig,
    build_parser,
    check_config,
    default_model,
    parse_config,
    report,
)
from ddp_tutorial.training.preemption import (
    PREEMPTED_EXIT_CODE,
    StopRequest,
    exit_on_sigterm,
    partial_epoch,
    resume_running,
)
from ddp_tutorial.training.reproducibility import deterministic_for, seed_everything

# TrainConfig, ConfigError, build_parser and default_model live in ``options``; imported here, where
# the notebooks and tests have always found them.
__all__ = ["TrainConfig", "ConfigError", "build_parser", "default_model", "train", "fit", "progress",
           "maybe_fail", "main"]

FAILURE_EXIT_CODE = 13
# What build() reads back from a checkpoint (epoch_state writes them); model_name and dataset are compared.
RESUME_KEYS = ("model", "optimizer", "rng", "epoch", "step", "history", "model_name", "dataset")


@dataclass
class Setup:
    """What a rank trains with: the bare model, its DDP wrapper, the optimizer and the loaders."""

    model: nn.Module
    ddp: DDP
    optimizer: torch.optim.Optimizer
    train_loader: DataLoader
    test_loader: DataLoader
    model_name: str
    history: list = field(default_factory=list)
    world_sizes: list = field(default_factory=list)  # each epoch's world size (an elastic run changes it)
    start_epoch: int = 0
    step: int = 0
    partial: dict | None = None  # where a mid-epoch checkpoint stopped its epoch (preemption.partial_epoch)


def build(config: TrainConfig, rank: int, world_size: int, device: torch.device) -> Setup:
    """Data, model (restored from the checkpoint with ``--resume``), DDP and optimizer for one rank."""
    model_name = config.model or default_model(config.dataset)
    seed_everything(config.seed, deterministic_for(config.deterministic, device.type), cuda=device.type == "cuda")
    spec = load_dataset(config.dataset, data_dir=config.data_dir, download=config.download, seed=config.seed,
                        num_samples=config.num_samples, image_size=config.image_size)
    train_loader, test_loader = make_loaders(spec, config.batch_size, rank, world_size, seed=config.seed,
                                             workers=config.workers, pin_memory=device.type == "cuda")
    model = build_model(model_name, spec.in_channels, spec.num_classes).to(device)
    state = None
    if config.resume and agree_to_resume(config.checkpoint):  # rank 0's answer, on every rank
        state = load_checkpoint(config.checkpoint, map_location=device, require=RESUME_KEYS,
                                expect={"model_name": model_name, "dataset": config.dataset})
        try:
            model.load_state_dict(state["model"])
        except (RuntimeError, KeyError) as exc:
            raise CheckpointError(f"checkpoint {config.checkpoint} does not fit model {model_name!r}: "
                                  f"{str(exc).splitlines()[0]}") from None
    # DDP broadcasts rank 0's weights at construction, so all ranks start equal.
    ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=config.lr, momentum=config.momentum)
    setup = Setup(model, ddp, optimizer, train_loader, test_loader, model_name)
    if state is not None:
        optimizer.load_state_dict(state["optimizer"])
        restore_rng(state["rng"])
        setup.start_epoch, setup.step, setup.history = state["epoch"], state["step"], list(state["history"])
        setup.world_sizes = list(state.get("world_sizes", [state.get("world_size")] * state["epoch"]))
        setup.partial = state.get("partial")
    return setup


def maybe_fail(config: TrainConfig, step: int, rank: int, world_size: int, attempt: int) -> None:
    """Fault injection: the last rank dies hard at ``--fail-at-step``, on the first attempt only."""
    if config.fail_at_step == step and attempt == 0 and rank == world_size - 1:
        print(f"rank {rank}: injected failure at step {step} (attempt {attempt})", file=sys.stderr, flush=True)
        os._exit(FAILURE_EXIT_CODE)  # like a killed process: no clean-up, no exception to catch


def progress(loader: Iterable, rank: int, desc: str, total: int | None = None) -> Iterable:
    if rank != 0:
        return loader
    from tqdm.auto import tqdm

    # None: only on a terminal; False: spawn shows this rank live (Jupyter, a terminal),
    # and leaves the bar (leave=False clears it) out of the cell's final output.
    return tqdm(loader, desc=desc, total=total, leave=False, disable=False if watched_live() else None)


def train(rank: int, world_size: int, config: TrainConfig) -> dict:
    """Train and evaluate on this rank; return the history (same on every rank) and final weights.

    A ``launch.spawn`` target, and the body of ``main()`` under torchrun or alone.
    """
    check_config(config)
    previous = exit_on_sigterm()
    stop = StopRequest(config.stop_on_signal)
    try:
        # The request outlives the group: a repeated SIGTERM while the group is torn down is noted,
        # not fatal (Slurm may signal a step more than once).
        with stop, distributed() as (info, device):
            if (info.rank, info.world_size) != (rank, world_size):
                raise RuntimeError(f"environment says rank {info.rank} of {info.world_size}, "
                                   f"caller says {rank} of {world_size}")
            return fit(config, rank, world_size, device, info.restart_count, stop)
    finally:
        if previous is not None:
            # A rank stopping on SIGTERM ignores any repeat until it exits: its exit code (75) is the
            # job script's cue to requeue, and a second signal must not turn it into 143.
            signal.signal(signal.SIGTERM, signal.SIG_IGN if "TERM" in stop.arrived else previous)


def fit(config: TrainConfig, rank: int, world_size: int, device: torch.device, attempt: int,
        stop: StopRequest | None = None) -> dict:
    stop = stop or StopRequest(None)
    setup = build(config, rank, world_size, device)
    log = print if (rank == 0 and config.log) else (lambda *a, **k: None)
    if setup.start_epoch or setup.partial:
        log(f"resumed from {os.path.basename(config.checkpoint)} after epoch {setup.start_epoch} "
            f"(step {setup.step}), attempt {attempt}")
        if setup.partial and setup.partial["world_size"] != world_size:
            log(f"the checkpoint stopped in an epoch on {setup.partial['world_size']} process(es): "
                f"epoch {setup.start_epoch + 1} restarts from its first batch on the saved weights")
    elif config.resume:
        log(f"no checkpoint yet: starting from scratch (attempt {attempt})")
    written, step, train_seconds, samples, preempted = 0, setup.step, 0.0, 0, False
    every_step = "TERM" in stop.signames  # SIGTERM leaves seconds, not an epoch: agree before each step
    for epoch in range(setup.start_epoch, config.num_epochs):
        setup.train_loader.sampler.set_epoch(epoch)  # a different shuffle each epoch, same on all ranks
        setup.ddp.train()
        batches = iter(setup.train_loader)  # first: creating it draws from the generator a resume restores
        done, running = resume_running(setup.partial, rank, world_size, device)  # running: loss sum, samples
        if done:
            restore_rng(setup.partial["rng"])
            for _ in range(done):  # the batches the interrupted run trained (the sampler's order is seed + epoch)
                next(batches)
        setup.partial = None
        start = time.perf_counter()
        for x, y in progress(batches, rank, f"epoch {epoch + 1}", total=len(setup.train_loader) - done):
            if every_step and stop.agreed(device, ["TERM"]):
                preempted = True
                break
            step, done = step + 1, done + 1
            maybe_fail(config, step, rank, world_size, attempt)
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            setup.optimizer.zero_grad(set_to_none=True)
            loss = F.cross_entropy(setup.ddp(x), y)
            loss.backward()  # DDP all-reduces the gradients here
            setup.optimizer.step()
            running[0] += loss.detach().double() * len(y)
            running[1] += len(y)
        train_seconds += time.perf_counter() - start
        if preempted:  # mid-epoch: the weights, and where the epoch stopped, within the grace time
            partial = partial_epoch(done, running, capture_rng())
            if rank == 0:
                save_checkpoint(dict(epoch_state(setup, epoch, step, config, world_size), partial=partial),
                                config.checkpoint)
            log(f"stopping in epoch {epoch + 1} after step {step} on SIGTERM: checkpoint saved; resume with --resume")
            break
        dist.all_reduce(running)
        samples += int(running[1].item())
        record = {"epoch": epoch + 1, "step": step, "train_loss": running[0].item() / running[1].item()}
        record.update(evaluate(setup.model, setup.test_loader, device))
        setup.history.append(record)
        setup.world_sizes.append(world_size)
        if config.checkpoint and rank == 0:
            save_checkpoint(epoch_state(setup, epoch + 1, step, config, world_size), config.checkpoint)
            written += 1
        # Logged after the save: an epoch in the log is an epoch in the checkpoint.
        log(f"epoch {epoch + 1}/{config.num_epochs}  step {step}  train_loss {record['train_loss']:.4f}  "
            f"test_loss {record['test_loss']:.4f}  test_acc {record['test_acc']:.4f}")
        if epoch + 1 < config.num_epochs and stop.agreed(device):  # every rank stops here, or none
            why = "/".join("SIG" + name for name in sorted(stop.arrived)) or "another rank's signal"
            log(f"stopping after epoch {epoch + 1} on {why}: checkpoint saved; resume with --resume")
            preempted = True
            break
    return {"rank": rank, "world_size": world_size, "model_name": setup.model_name, "attempt": attempt,
            "history": setup.history, "final": setup.history[-1] if setup.history else None, "steps": step,
            "checkpoints_written": written, "train_seconds": train_seconds, "samples_trained": samples,
            "world_sizes": setup.world_sizes, "preempted": preempted,
            "weights": {k: v.detach().cpu() for k, v in setup.model.state_dict().items()}}


def epoch_state(setup: Setup, epochs_done: int, step: int, config: TrainConfig, world_size: int) -> dict:
    """What rank 0 checkpoints: weights, optimizer, RNG and history after ``epochs_done`` epochs and ``step`` steps."""
    return {"model": setup.model.state_dict(), "optimizer": setup.optimizer.state_dict(),
            "epoch": epochs_done, "step": step, "rng": capture_rng(), "history": setup.history,
            "model_name": setup.model_name, "dataset": config.dataset, "world_size": world_size,
            "world_sizes": setup.world_sizes}


def main(argv: list[str] | None = None) -> int:
    config = parse_config(argv)
    try:
        info = rank_info(module="ddp_tutorial.training.train")
        if config.checkpoint and info.rank == 0:
            check_writable(config.checkpoint)  # now, not after the first epoch has trained
        start = time.perf_counter()
        result = train(info.rank, info.world_size, config)
    except (ConfigError, DataError, CheckpointError, NotLaunchedError) as exc:
        report(f"ddp_tutorial.training.train: error: {exc}")
        return 2
    except KeyboardInterrupt:  # Ctrl-C: the group is left, DataLoader workers stop with their loader
        saved = (f"the last checkpoint is {config.checkpoint}; add --resume to continue from it"
                 if config.checkpoint and os.path.isfile(config.checkpoint) else "no checkpoint was saved")
        report(f"ddp_tutorial.training.train: interrupted: {saved}")
        return INTERRUPTED_EXIT_CODE
    except RuntimeError as exc:  # another rank died: gloo's 20-line traceback says only that
        if not peer_lost(exc):
            raise
        print(peer_lost_line("ddp_tutorial.training.train", exc), file=sys.stderr, flush=True)
        return 1
    if result["preempted"]:
        return PREEMPTED_EXIT_CODE  # on every rank: the job script requeues on this code
    if info.is_main:
        final = result["final"]
        rate = result["samples_trained"] / max(result["train_seconds"], 1e-9)
        print(f"final test accuracy {final['test_acc']:.4f} on {final['test_samples']} test samples "
              f"after {final['epoch']} epochs, {info.world_size} process(es), "
              f"{time.perf_counter() - start:.1f} s ({rate:.0f} training samples/s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
