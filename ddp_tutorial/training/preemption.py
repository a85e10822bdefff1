"""Stop cleanly on a scheduler's early warning, so a requeued job resumes where it stopped (``15_cluster``).

A cluster job has a time limit, and a higher-priority job may preempt it. Slurm can warn
first: ``#SBATCH --signal=USR1@120`` sends SIGUSR1 to every task 120 s before the limit.
The training then finishes the epoch it is in (which ``train`` checkpoints), every rank
agrees to stop, and the job exits with ``PREEMPTED_EXIT_CODE``; the job script sees that
code and runs ``scontrol requeue $SLURM_JOB_ID``, and the requeued job resumes from the
checkpoint (``--resume``) to the same weights as a run that was never interrupted:

    srun python -m ddp_tutorial.cluster.jobs ddp_tutorial.training.train --checkpoint ckpt.pt --resume --stop-on-signal USR1

Why agree: the signal reaches the ranks at slightly different moments. A rank that
stopped alone would leave the others waiting in the next all-reduce until they time out.
So at each epoch's end the ranks all-reduce (MAX) one flag, and all stop or none does.
"""

from __future__ import annotations

import signal
import threading
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["PREEMPTED_EXIT_CODE", "StopRequest", "exit_on_sigterm"]

# EX_TEMPFAIL from sysexits.h: "temporary failure, try again later", which is what a
# preempted job is. The job script requeues on exactly this code, and on no other.
PREEMPTED_EXIT_CODE = 75


class StopRequest:
    """Remember that ``signame`` (``"USR1"``, ``"TERM"``, ...) arrived; ``None`` listens to nothing.

    Use as a context manager: the previous handler is back afterwards. The handler only
    sets a flag (whatever the rank is doing finishes first); ``agreed`` asks every rank.
    """

    def __init__(self, signame: str | None):
        self.signame = signame
        self.received = False
        self._previous = None
        if signame is not None:
            name = signame.upper() if signame.upper().startswith("SIG") else "SIG" + signame.upper()
            if not hasattr(signal, name):
                raise ValueError(f"unknown signal {signame!r}: use a name like USR1, USR2 or TERM")
            self._signum = getattr(signal, name)

    def __enter__(self) -> StopRequest:
        # signal handlers can only be set on the main thread (a notebook's spawn runs ranks there)
        if self.signame is not None and threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(self._signum, self._note)
        return self

    def __exit__(self, *exc) -> None:
        if self._previous is not None:
            signal.signal(self._signum, self._previous)
            self._previous = None

    def _note(self, signum, _frame) -> None:
        self.received = True

    def agreed(self, device: torch.device | str = "cpu") -> bool:
        """True on every rank when any rank received the signal (a collective: call it on all ranks)."""
        if self.signame is None:
            return False
        flag = torch.tensor([1 if self.received else 0], device=device)
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())


def exit_on_sigterm() -> Any:
    """Turn SIGTERM (torchrun stopping the job, a scheduler's time limit) into ``SystemExit``.

    By default SIGTERM ends the process on the spot; as an exception it unwinds,
    so a checkpoint being written removes its temporary file and the group is
    destroyed. Returns the previous handler (None when not on the main thread).
    """
    if threading.current_thread() is not threading.main_thread():
        return None

    def stop(signum, _frame):
        raise SystemExit(128 + signum)

    return signal.signal(signal.SIGTERM, stop)
