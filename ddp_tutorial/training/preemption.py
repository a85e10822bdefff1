"""Stop cleanly when the scheduler says so, so a requeued job resumes where it stopped (``16_cluster``).

Slurm ends a job in one of two ways, and each has its own path here:

- **the time limit**: ``#SBATCH --signal=USR1@120`` sends SIGUSR1 to every task 120 s before
  it (``B:USR1@120``: to the batch script, whose trap passes it on; ``--signal`` is tied to the
  time limit only). There is time: the training finishes the epoch it is in, checkpoints, stops.
- **preemption**: SIGTERM to every process at once, SIGKILL after the partition's
  ``GraceTime`` (0 by default, often 30-120 s). No time for an epoch: with ``--stop-on-signal
  USR1,TERM`` the ranks stop after the step they are in, rank 0 writes a mid-epoch checkpoint
  (with where the epoch stopped), and the resumed run skips the batches already trained, to
  the same weights as a run never interrupted.

Either way every rank exits with ``PREEMPTED_EXIT_CODE``; ``requeue.sbatch`` requeues on it:

    srun python -m ddp_tutorial.cluster.jobs ddp_tutorial.training.train --checkpoint ckpt.pt --resume --stop-on-signal USR1,TERM

Why agree: a signal reaches the ranks at slightly different moments. A rank that stopped
alone would leave the others waiting in the next all-reduce until they time out. So the
ranks all-reduce (MAX) one flag, at each epoch's end for USR1 and before each step for TERM,
and all stop or none does. Without TERM in the list, ``exit_on_sigterm`` keeps torch's
launchers' meaning: torchrun stops its workers with SIGTERM to restart them (lesson 09).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["PREEMPTED_EXIT_CODE", "StopRequest", "signal_names", "exit_on_sigterm", "partial_epoch", "resume_running"]

# EX_TEMPFAIL from sysexits.h: "temporary failure, try again later", which is what a
# preempted job is. The job script requeues on exactly this code, and on no other.
PREEMPTED_EXIT_CODE = 75
UNCATCHABLE = ("KILL", "STOP")  # the kernel acts on these itself: no handler ever runs


def signal_names(signames: str | Iterable[str] | None) -> tuple[str, ...]:
    """``"usr1,SIGTERM"`` -> ``("USR1", "TERM")``; unknown or uncatchable names raise ``ValueError``."""
    if signames is None:
        return ()
    parts = signames.split(",") if isinstance(signames, str) else list(signames)
    names = tuple(p.strip().upper().removeprefix("SIG") for p in parts if p.strip())
    for name in names:
        # signal.Signals, not hasattr(signal, ...): SIG_DFL and SIG_IGN are module attributes, not signals
        if "SIG" + name not in signal.Signals.__members__:
            raise ValueError(f"unknown signal {name!r}: use names like USR1, USR2 or TERM")
        if name in UNCATCHABLE:
            raise ValueError(f"SIG{name} cannot be caught, so a run cannot stop cleanly on it: "
                             "use USR1, USR2 or TERM")
    return names


class StopRequest:
    """Remember which of ``signames`` (``"USR1"``, ``"USR1,TERM"``, ...) arrived; ``None`` listens to nothing.

    Use as a context manager: the previous handlers are back afterwards. A handler only
    notes the signal (whatever the rank is doing finishes first); ``agreed`` asks every rank.
    """

    def __init__(self, signames: str | Iterable[str] | None):
        self.signames = signal_names(signames)
        self.arrived: set[str] = set()
        self._previous: dict[int, Any] = {}

    @property
    def received(self) -> bool:
        return bool(self.arrived)

    def __enter__(self) -> StopRequest:
        # signal handlers can only be set on the main thread (a notebook's spawn runs ranks there)
        if threading.current_thread() is threading.main_thread():
            for name in self.signames:
                signum = getattr(signal, "SIG" + name)
                self._previous[signum] = signal.signal(signum, self._note)
        return self

    def __exit__(self, *exc) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous = {}

    def _note(self, signum, _frame) -> None:
        self.arrived.add(signal.Signals(signum).name.removeprefix("SIG"))

    def agreed(self, device: torch.device | str = "cpu", among: Iterable[str] | None = None) -> bool:
        """True on every rank when any rank received one of ``among`` (default: any listened signal).

        A collective when this request listens to any of ``among``: call it on every rank alike.
        """
        among = self.signames if among is None else tuple(n for n in signal_names(among) if n in self.signames)
        if not among:
            return False
        flag = torch.tensor([1 if self.arrived & set(among) else 0], device=device)
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())


def partial_epoch(batches: int, running: torch.Tensor, rng: dict[str, Any]) -> dict[str, Any]:
    """Where an epoch stopped, for a mid-epoch checkpoint (a collective: every rank calls it).

    Every rank's running sums are gathered, so a resumed rank continues its own sum and the
    epoch's logged loss is the one an uninterrupted run logs, bit for bit.
    """
    parts = [running.clone() for _ in range(dist.get_world_size())] if dist.is_initialized() else [running]
    if dist.is_initialized():
        dist.all_gather(parts, running)
    return {"batches": batches, "running": [p.cpu() for p in parts], "world_size": len(parts), "rng": rng}


def resume_running(partial: dict[str, Any] | None, rank: int, world_size: int,
                   device: torch.device) -> tuple[int, torch.Tensor]:
    """Batches of this epoch already trained, and this rank's running sums to continue from.

    A partial epoch saved with another world size does not apply (each rank's share of the
    data differs): the epoch restarts from its first batch, on the saved weights.
    """
    if partial is None or partial["world_size"] != world_size:
        return 0, torch.zeros(2, dtype=torch.float64, device=device)
    return partial["batches"], partial["running"][rank].to(device=device, dtype=torch.float64)


def exit_on_sigterm() -> Any:
    """Turn SIGTERM (torchrun stopping its workers, a scheduler ending the job) into ``SystemExit``.

    By default SIGTERM ends the process on the spot; as an exception it unwinds,
    so a checkpoint being written removes its temporary file and the group is
    destroyed. ``StopRequest("TERM")`` replaces this inside its block (stop after
    the step, checkpoint). Returns the previous handler (None when not on the main thread).
    """
    if threading.current_thread() is not threading.main_thread():
        return None

    def stop(signum, _frame):
        raise SystemExit(128 + signum)

    return signal.signal(signal.SIGTERM, stop)
