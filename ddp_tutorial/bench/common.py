"""What every benchmark shares: the result record, a table printer, the course's timer (``timing``),
and the command line's rules (``BenchParser``, ``output_problem``): a bad option is one line, before
any benchmark runs.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from ddp_tutorial.launch.errors import UsageParser
from ddp_tutorial.timing import timed  # noqa: F401  (the benchmarks' timer is the lessons' one)


def checked(kind: type) -> Callable[[str], Any]:
    """An argparse ``type`` for a benchmark's numbers: an int is a count (ranks, repeats, bytes, sizes),
    at least 1; a float a positive, finite amount (milliseconds, megabytes)."""

    def convert(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid {kind.__name__} value: {text!r}") from None
        if kind is int and value < 1:
            raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
        if kind is float and not (math.isfinite(value) and value > 0):
            raise argparse.ArgumentTypeError(f"must be a positive finite number, got {value:g}")
        return value

    convert.__name__ = kind.__name__  # argparse names the type in its messages
    return convert


class BenchParser(UsageParser):
    """The parser of ``python -m ddp_tutorial.bench``: errors in one line (``UsageParser``), and every
    ``int`` or ``float`` option a subcommand adds is ``checked``, so no benchmark runs on a zero count
    (``launch --repeat 0`` would time nothing and print ``inf``)."""

    def add_argument(self, *names: str, **kwargs: Any) -> argparse.Action:
        if kwargs.get("type") in (int, float):
            kwargs["type"] = checked(kwargs["type"])
        return super().add_argument(*names, **kwargs)


def output_problem(path: str) -> str | None:
    """Why ``path`` cannot be written (a folder, a missing or non-folder parent, no permission), or None.

    Asked before any benchmark runs, so that a typo does not lose a long run's results at the end.
    Probes as the write will: an existing file is opened for appending (nothing changes), a new
    one is created and removed.
    """
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        return "it is a folder; give a file path"
    if not os.path.exists(folder):
        ancestor = folder
        while not os.path.exists(ancestor):
            ancestor = os.path.dirname(ancestor)
        if not os.path.isdir(ancestor):
            return f"{ancestor} is not a folder"
        return f"the folder {folder} does not exist; create it first"
    if not os.path.isdir(folder):
        return f"{folder} is not a folder"
    existed = os.path.exists(path)
    try:
        with open(path, "a"):
            pass
    except OSError as exc:
        return f"{exc.strerror or exc}; choose a path you can write to"
    if not existed:
        os.unlink(path)
    return None


@dataclass
class Result:
    """One benchmark's outcome: ``rows`` (a table, a dict per row) and ``ratios`` (the headline numbers)."""

    name: str
    columns: list[str]
    rows: list[dict[str, Any]] = field(default_factory=list)
    ratios: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def __str__(self) -> str:
        parts = [f"== {self.name} ==", format_table(self.columns, self.rows)]
        parts += [f"{key}: {value:.3g}" for key, value in self.ratios.items()]
        parts += self.notes
        return "\n".join(parts)


def format_table(columns: list[str], rows: list[dict[str, Any]]) -> str:
    def cell(value: Any) -> str:
        return f"{value:.4g}" if isinstance(value, float) else str(value)

    cells = [[cell(row.get(c, "")) for c in columns] for row in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.rjust(w) for c, w in zip(columns, widths))]
    lines += ["  ".join(v.rjust(w) for v, w in zip(r, widths)) for r in cells]
    return "\n".join(lines)
