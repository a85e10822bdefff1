"""How ``launch.spawn`` reports ranks that failed: the error types and which rank caused it."""

from __future__ import annotations

from typing import Sequence

# A rank's report: (message, remote traceback, stage), stage "init" (setting up the group) or "run".
Report = tuple[str, str, str]

# Errors a rank gets because a *peer* failed: not the cause.
PEER_FAILURE = ("Connection closed by peer", "Connection reset by peer", "Broken pipe",
                "remote worker crashing", "NCCL communicator was aborted")


class WorkerError(RuntimeError):
    """A rank raised (or died). ``rank`` is the first failing rank, ``remote_traceback`` its traceback."""

    def __init__(self, rank: int, message: str, remote_traceback: str = ""):
        self.rank = rank
        self.remote_traceback = remote_traceback
        text = f"rank {rank} failed: {message}"
        if remote_traceback:
            text += f"\n\n--- traceback from rank {rank} ---\n{remote_traceback.rstrip()}"
        super().__init__(text)


class WorkerTimeout(WorkerError, TimeoutError):
    """Ranks were still running when the timeout ran out. ``ranks`` lists them."""

    def __init__(self, ranks: Sequence[int], timeout: float):
        self.ranks = list(ranks)
        RuntimeError.__init__(
            self, f"timed out after {timeout:g} s; ranks still running: {self.ranks} "
            "(a hang: a collective some rank never reached, or a deadlock in send/recv)")
        self.rank = self.ranks[0]
        self.remote_traceback = ""


def is_init_flake(results: dict, errors: dict[int, Report]) -> bool:
    """True when every report came from a failed gloo connection set-up: nothing ran yet.

    gloo's set-up sometimes fails on a loaded machine before any worker code ran;
    only then is a fresh attempt on a fresh store safe.
    """
    return bool(errors) and not results and all(
        stage == "init" and "connectFullMesh" in message for message, _, stage in errors.values())


def root_cause(errors: dict[int, Report]) -> int:
    """The rank whose error is the cause: the first reported one that is not a peer failure."""
    for rank in errors:  # dicts keep arrival order
        if not any(marker in errors[rank][0] for marker in PEER_FAILURE):
            return rank
    return next(iter(errors))


def worker_error(errors: dict[int, Report]) -> WorkerError:
    """One ``WorkerError`` for all failed ranks: the root cause's, naming the others."""
    rank = root_cause(errors)
    message, remote_tb, _ = errors[rank]
    others = sorted(set(errors) - {rank})
    if others:
        message += f" (ranks {others} failed too, probably as a consequence)"
    return WorkerError(rank, message, remote_tb)
