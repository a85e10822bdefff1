"""Spawn targets for tests/cluster/test_jobs.py (spawned functions must live in an importable module)."""

from __future__ import annotations

import os
import signal


def train_signalled_in_first_epoch(rank: int, world_size: int, config) -> dict:
    """``train.train``, with the last rank sent ``config.stop_on_signal`` while it scores epoch 1.

    Only one rank gets the signal, as when Slurm's warning reaches the nodes at different moments.
    """
    from ddp_tutorial.training import train

    real_evaluate = train.evaluate

    def evaluate(*args, **kwargs):
        if rank == world_size - 1 and not getattr(evaluate, "sent", False):
            evaluate.sent = True
            os.kill(os.getpid(), getattr(signal, "SIG" + config.stop_on_signal))
        return real_evaluate(*args, **kwargs)

    train.evaluate = evaluate
    try:
        result = train.train(rank, world_size, config)
    finally:
        train.evaluate = real_evaluate
    result.pop("weights")
    return result


def train_terminated_at_step(rank: int, world_size: int, config, at_step: int) -> dict:
    """``train.train``, with the last rank sent SIGTERM (a preemption's notice) during step ``at_step``."""
    from ddp_tutorial.training import train

    real_maybe_fail = train.maybe_fail

    def maybe_fail(config, step, rank, world_size, attempt):
        if step == at_step and rank == world_size - 1:
            os.kill(os.getpid(), signal.SIGTERM)
        return real_maybe_fail(config, step, rank, world_size, attempt)

    train.maybe_fail = maybe_fail
    try:
        result = train.train(rank, world_size, config)
    finally:
        train.maybe_fail = real_maybe_fail
    result["sigterm_after"] = signal.getsignal(signal.SIGTERM) is signal.SIG_IGN  # a repeat cannot kill it now
    return result
