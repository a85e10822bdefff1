"""What one ``launch.spawn`` call runs: its settings in one frozen object, checked once."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

LOCALHOST = "127.0.0.1"
LIVE_ENV = "DDP_TUTORIAL_LIVE"  # set to "1" in ranks whose output is shown while they run
# Jupyter kernels set FORCE_COLOR=1, and from Python 3.13 on a child then writes its
# tracebacks with colour codes, even into a file or a pipe; captured output is read as text.
PLAIN_TEXT = {"PYTHON_COLORS": "0"}


def watched_live() -> bool:
    """True inside a rank whose output ``spawn`` shows while it runs (Jupyter, a terminal).

    There a progress bar is seen as it moves (and left out of the final relay);
    elsewhere (nbval, pytest, a pipe) nobody would see it move.
    """
    return os.environ.get(LIVE_ENV) == "1"


def free_port(host: str = LOCALHOST) -> int:
    """A port that was free a moment ago (for tools that need a number up front)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@dataclass(frozen=True)
class LaunchSpec:
    """The settings of one launch, passed whole to the parent's loop and to every rank.

    One object instead of ten positional parameters: two of them cannot be swapped
    silently, and a bad value is refused before any process starts.
    """

    fn: Callable[..., Any]
    world_size: int = 2
    args: tuple = ()
    backend: str | None = None  # None: the best available (ddp_tutorial.env.choose_backend)
    timeout: float = 60.0
    init_process_group: bool = True
    threads: int = 0  # torch threads per rank; 0: the cores shared out between the ranks
    master_addr: str = LOCALHOST
    live: bool = False  # the parent shows rank output while the ranks run

    def __post_init__(self) -> None:
        check_target(self.fn)
        if not isinstance(self.world_size, int) or isinstance(self.world_size, bool) or self.world_size < 1:
            raise ValueError(f"world_size must be a whole number >= 1, got {self.world_size!r}")
        if self.timeout <= 0:
            raise ValueError(f"timeout must be positive, got {self.timeout!r}")
        object.__setattr__(self, "args", tuple(self.args))
        if not self.threads:
            object.__setattr__(self, "threads", max(1, (os.cpu_count() or 1) // self.world_size))

    def rank_env(self, rank: int, master_port: int) -> dict[str, str]:
        """The environment of ``rank``: the caller's, plus what torchrun would set for it."""
        env = dict(os.environ, MASTER_ADDR=self.master_addr, MASTER_PORT=str(master_port),
                   WORLD_SIZE=str(self.world_size), RANK=str(rank), LOCAL_RANK=str(rank),
                   LOCAL_WORLD_SIZE=str(self.world_size), TORCHELASTIC_USE_AGENT_STORE="True",
                   OMP_NUM_THREADS=str(self.threads), **PLAIN_TEXT)
        env.pop(LIVE_ENV, None)  # inherited from an outer launch: this launch decides
        if self.live:
            env[LIVE_ENV] = "1"
        return env


def check_target(fn: Callable) -> None:
    """Refuse, with advice, a worker that the ranks could not import."""
    if not callable(fn):
        raise TypeError(f"spawn() needs a function to run on every rank, got {type(fn).__name__}: {fn!r}")
    module = getattr(fn, "__module__", None)
    qualname = getattr(fn, "__qualname__", getattr(fn, "__name__", repr(fn)))
    if module == "__main__":
        raise ValueError(
            f"the worker {qualname!r} is defined in __main__ (a notebook or a script run directly); "
            "child processes cannot import it. Move it into a module (for example "
            "ddp_tutorial/my_lesson.py) and import it from there.")
    if "<locals>" in qualname or "<lambda>" in qualname:
        raise ValueError(f"the worker {qualname!r} is a lambda or nested function, which cannot be "
                         "pickled; define it at the top level of a module.")
