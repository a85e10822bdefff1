"""What the ranks print: read from their output files while they run, relayed in rank order at the end.

Each rank writes to a file of its own (``child.run_rank``). The parent reads the
files as they grow, so it can show the lines live (``live.py``), and relays
them all, rank by rank, when the launch is over: the part a notebook stores,
identical however the ranks interleaved.

A carriage return (a progress bar redrawing its line) overwrites the line, as in
a terminal: only the text after the last one counts, and a line left blank by
it (a bar that cleared itself) is dropped.
"""

from __future__ import annotations

import codecs
import re
from collections.abc import Sequence
from typing import IO

# The line breaks of str.splitlines() except a lone "\r", which only returns to the line's start.
_LINE_BREAK = re.compile("\r\n|[\n\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]")


def is_noise(line: str) -> bool:
    """gloo's own start-up chatter, which would make the output depend on timing."""
    return line.startswith("[Gloo] Rank ") and "connected to" in line


def shown(line: str) -> str | None:
    """What is left of a finished line once carriage returns did their work; None: nothing."""
    if "\r" in line:
        line = line.rsplit("\r", 1)[1]
        if not line.strip():
            return None
    return None if is_noise(line) else line


def in_progress(partial: str) -> str:
    """The visible part of an unfinished line: its last non-empty carriage-return segment."""
    return partial.rstrip("\r").rsplit("\r", 1)[-1]


class RankOutput:
    """One rank's output file, read as it grows: its finished lines, and the line being written."""

    def __init__(self, path: str):
        self.path = path
        self.lines: list[str] = []  # every finished line so far, as ``shown`` leaves it
        self.partial = ""  # the unfinished last line, carriage returns and all
        self._file: IO[bytes] | None = None
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def read(self) -> list[str]:
        """The lines finished since the last call (the rank may not have created its file yet)."""
        if self._file is None:
            try:
                self._file = open(self.path, "rb")
            except FileNotFoundError:
                return []
        data = self._file.read()
        if not data:
            return []
        # A "\r" at the very end stays in the partial line: it may be the first half of "\r\n".
        pieces = _LINE_BREAK.split(self.partial + self._decoder.decode(data))
        self.partial = pieces.pop()
        new = [line for line in map(shown, pieces) if line is not None]
        self.lines += new
        return new

    def finish(self) -> list[str]:
        """Read what is left; an unfinished last line counts as finished. Returns the new lines."""
        new = self.read()
        rest = (self.partial + self._decoder.decode(b"", final=True)).rstrip("\r")
        last = shown(rest) if rest else None
        self.partial = ""
        if last is not None:
            self.lines.append(last)
            new.append(last)
        if self._file is not None:
            self._file.close()
            self._file = None
        return new


def relay(outputs: Sequence[RankOutput], stream: IO[str]) -> None:
    """Print every rank's lines as ``[rank N] ...``, all of rank 0's first, then rank 1's, ..."""
    for rank, output in enumerate(outputs):
        for line in output.lines:
            print(f"[rank {rank}] {line}", file=stream)
    stream.flush()
