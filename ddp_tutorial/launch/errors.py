"""How the launchers report trouble: ranks that failed (and which caused it), an interrupt, a bad option.

A command line that may run under torchrun (``training.train``, ``capstone.composed``,
``tensor_parallel.split_mlp``, ...) refuses a bad option in one line, said once per node by
local rank 0 (``report``, ``UsageParser``, ``usage_error``), before any process group: every rank
finds the same fault in the same options and environment (``check_world_size`` reads torchrun's
``WORLD_SIZE``), so the others exit with the same code silently. Ctrl-C ends such a command with
one line and ``INTERRUPTED_EXIT_CODE`` (``exit_on_interrupt``), and so does a peer's death (exit 1).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from types import TracebackType
from typing import NoReturn, TypeVar

from ddp_tutorial.env import NotLaunchedError, local_rank, rank_info

T = TypeVar("T")

USAGE_EXIT_CODE = 2  # what argparse exits with on a bad option
INTERRUPTED_EXIT_CODE = 130  # 128 + SIGINT, what a shell reports for a program stopped by Ctrl-C

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


class LaunchInterrupted(KeyboardInterrupt):
    """Ctrl-C (Jupyter's stop button) during a launch; raised once everything it started is stopped.

    The message says what happened to the processes ("ranks 0-1 stopped, nothing left
    running"). It is a ``KeyboardInterrupt``, so a notebook's "Run All" stops at it. In
    Jupyter its traceback shows only the learner's frames: the launcher's waiting loop
    is noise there (its frames set ``__tracebackhide__``, the convention of IPython and pytest).
    """

    def _render_traceback_(self) -> list[str]:
        # IPython's hook for exceptions that render their own traceback (ipyparallel uses it)
        try:
            from IPython import get_ipython

            return get_ipython().InteractiveTB.structured_traceback(
                type(self), self, _without_hidden_frames(self.__traceback__), tb_offset=0)
        except Exception:  # never lose the interrupt to a rendering problem
            return traceback.format_exception_only(type(self), self)


def _without_hidden_frames(tb: TracebackType | None) -> TracebackType | None:
    """The traceback without frames that set ``__tracebackhide__`` (the launcher's, IPython's own)."""
    kept = []
    while tb is not None:
        if not tb.tb_frame.f_locals.get("__tracebackhide__"):
            kept.append(tb)
        tb = tb.tb_next
    rebuilt = None
    for entry in reversed(kept):
        rebuilt = TracebackType(rebuilt, entry.tb_frame, entry.tb_lasti, entry.tb_lineno)
    return rebuilt


def stopped_message(what: str, left: Sequence[int]) -> str:
    """What an interrupted launcher did: ``what`` stopped, and which of its processes survived (``left``)."""
    if not left:
        return f"{what} stopped, nothing left running"
    return (f"{what} stopped, but {len(left)} of their processes still run (pids {', '.join(map(str, left))}): "
            "stop them with kill -9")


def rank_range(ranks: Sequence[int]) -> str:
    """``[0, 1, 2]`` -> "ranks 0-2"; ``[0]`` -> "rank 0"; ``[]`` -> "no rank"."""
    ranks = sorted(ranks)
    if not ranks:
        return "no rank"
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"ranks {ranks[0]}-{ranks[-1]}"
    return "ranks " + ", ".join(map(str, ranks))


def speaks_for_node() -> bool:
    """Local rank 0 reports for its node; with a broken launcher environment, every rank does."""
    try:
        return local_rank() == 0
    except NotLaunchedError:
        return True


def report(line: str) -> None:
    """One line on stderr, once per node: every rank fails alike, local rank 0 says why."""
    if speaks_for_node():
        print(line, file=sys.stderr, flush=True)
    else:
        time.sleep(1.0)  # torchrun stops the job at the first exit: let local rank 0 say why first


def usage_error(prog: str, message: str) -> NoReturn:
    """``PROG: error: MESSAGE`` once per node (``report``), then exit 2, as argparse does for a bad option."""
    report(f"{prog}: error: {message}")
    sys.exit(USAGE_EXIT_CODE)


class UsageParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line (``usage_error``) instead of the usage and the error,
    once per node; its subcommands' parsers are ``UsageParser`` too."""

    def error(self, message: str) -> NoReturn:
        usage_error(self.prog, message)


def check_world_size(prog: str, check: Callable[[int], T], *, advice: str = "") -> T:
    """``check(world_size)`` with the launcher's world size (1 without torchrun), before any process group:
    its ``ValueError`` (an uneven split, a layout of another size) is a usage error, said once per node,
    followed by ``advice`` (what to do)."""
    try:
        return check(rank_info().world_size)
    except NotLaunchedError as err:
        usage_error(prog, str(err))
    except ValueError as err:
        usage_error(prog, f"{err}; {advice}" if advice else str(err))


@contextmanager
def exit_on_interrupt(prog: str, note: str) -> Iterator[None]:
    """Ctrl-C inside: one line, ``PROG: interrupted: NOTE``, once per node, and exit 130, no traceback.

    A peer's death (``peer_lost``) ends it with one line too, from every rank that saw it: ranks
    started by hand each have a terminal of their own, and none of them is the cause.
    """
    try:
        yield
    except KeyboardInterrupt:
        report(f"{prog}: interrupted: {note}")
        raise SystemExit(INTERRUPTED_EXIT_CODE) from None
    except RuntimeError as err:
        if not peer_lost(err):
            raise
        print(peer_lost_line(prog, err), file=sys.stderr, flush=True)
        raise SystemExit(1) from None


def peer_lost(err: BaseException) -> bool:
    """Whether ``err`` is what a rank gets when another rank of its group stopped (``PEER_FAILURE``)."""
    return isinstance(err, RuntimeError) and any(words in str(err) for words in PEER_FAILURE)


def peer_lost_line(prog: str, err: BaseException) -> str:
    """One line for a rank whose peer stopped: which rank, what the backend said, where to look."""
    said = next((words for words in PEER_FAILURE if words in str(err)), "a peer failed")
    rank = os.environ.get("RANK", "?")
    return (f"{prog}: rank {rank} lost a peer ({said}): another rank stopped or crashed, and its own output "
            "says why; under torchrun the agent stops the others for you")
