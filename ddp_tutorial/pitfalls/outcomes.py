"""Run one pitfall demo and describe what happened in one stable line (``12_debugging_and_pitfalls``).

Every demo of the lab is a worker with one classic mistake. ``outcome()`` runs it
through ``launch.spawn`` with a timeout and never raises: an error on some rank, a
hang stopped by the timeout, or the results come back as an ``Outcome``, and
``clean_message`` strips from torch's messages what changes between runs and
releases (log prefixes, source paths, ports), so a notebook can store them.
"""

from __future__ import annotations

import contextlib
import io
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ddp_tutorial.launch import WorkerError, WorkerTimeout, spawn

__all__ = ["Outcome", "outcome", "clean_message"]


@dataclass
class Outcome:
    """What a demo did: ``kind`` is ``"ok"``, ``"error"`` or ``"hang"``."""

    kind: str
    message: str
    results: list | None = None
    ranks: tuple = ()
    seconds: float = 0.0
    log: str = ""

    def __str__(self) -> str:
        if self.kind == "ok":
            return f"ok: {self.results}"
        if self.kind == "hang":
            return f"hang: ranks {list(self.ranks)} still waiting when the timeout ran out (all stopped)"
        return f"error on rank {self.ranks[0]}: {self.message}"

    def log_lines(self, pattern: str) -> list[str]:
        """Lines of the relayed output matching ``pattern``, without timestamps and source paths."""
        return [clean_message(line) for line in self.log.splitlines() if re.search(pattern, line)]


def clean_message(text: str) -> str:
    """Drop what changes between runs and versions: log prefixes, source paths, ports, tensor options."""
    text = re.sub(r"\[rank\d+\]:\[[A-Z]\d{4} [\d:.]+ [^\]]+\] ", "", text)
    text = re.sub(r"\[(enforce fail at )?/[^\]]*\] ", "", text)
    text = re.sub(r"\[?127\.0\.0\.1\]?:\d+", "127.0.0.1:PORT", text)
    text = re.sub(r", TensorDeviceTypes=TensorOptions\((?:[^()]|\([^()]*\))*\)", "", text)
    text = re.sub(r" \(ranks \[[\d, ]+\] failed too[^)]*\)", "", text)  # timing decides if they do
    return re.sub(r"\s+", " ", text).strip()


def outcome(fn: Callable[..., Any], world_size: int = 2, args: Sequence[Any] = (), *,
            timeout: float = 10.0, init_process_group: bool = False) -> Outcome:
    """Run ``fn`` on ``world_size`` ranks with ``launch.spawn``; never raises, never outlives ``timeout``."""
    buffer = io.StringIO()
    start = time.monotonic()
    try:
        with contextlib.redirect_stdout(buffer):
            results = spawn(fn, world_size, args, timeout=timeout,
                            init_process_group=init_process_group)
        found = Outcome("ok", "", results)
    except WorkerTimeout as exc:
        found = Outcome("hang", str(exc), ranks=tuple(exc.ranks))
    except WorkerError as exc:
        found = Outcome("error", clean_message(str(exc).split("\n")[0].split(": ", 1)[-1]), ranks=(exc.rank,))
    found.seconds = time.monotonic() - start
    found.log = buffer.getvalue()
    return found
