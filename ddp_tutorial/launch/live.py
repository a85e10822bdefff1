"""Rank output while the ranks run: a display in Jupyter that goes away, or lines in a terminal.

Which view (``choose_view``):
- a Jupyter front end a person uses: a *transient* display, updated as lines
  arrive and emptied at the end, when the ordered relay is printed as usual;
- a headless run (nbconvert, nbval: they allow no ``input()``): nothing live.
  They store every display a cell makes, and the stored output must stay the
  relay alone; nobody watches them anyway;
- a terminal: lines printed as they arrive (and not again at the end), a
  progress bar redrawn on the last line;
- anything else (a pipe, pytest capturing output): nothing live, the relay at the end.

The Jupyter display and the terminal show a one-line note while the processes start
("starting 2 ranks..."), replaced by the ranks' first lines.
"""

from __future__ import annotations

import shutil
import sys
from collections import deque
from collections.abc import Sequence
from typing import IO, Any, Protocol

_SHOWN_LINES = 40  # the transient display keeps the latest lines: a long run would flood the front end


class LiveView(Protocol):
    relay_at_end: bool  # whether the ordered relay is still printed when the launch ends

    def show(self, new: Sequence[tuple[int, str]], bars: dict[int, str]) -> None:
        """New finished lines (rank, text) in arrival order; the unfinished line of each rank."""

    def status(self, text: str) -> None:
        """A one-line note ("starting 2 ranks...") shown until the ranks' first lines replace it."""

    def close(self) -> None:
        """The launch is over: take down what is only there while it runs."""


class JupyterView:
    """A display that shows the latest lines and progress bars, emptied when the launch ends."""

    relay_at_end = True

    def __init__(self) -> None:
        self._lines: deque[str] = deque(maxlen=_SHOWN_LINES)
        self._count = 0
        self._status = ""
        self._text = ""
        self._handle: Any = None  # made on the first line or note: a quick launch leaves no trace

    def show(self, new: Sequence[tuple[int, str]], bars: dict[int, str]) -> None:
        if new:
            self._status = ""  # the ranks speak for themselves now
        self._lines.extend(f"[rank {rank}] {line}" for rank, line in new)
        self._count += len(new)
        hidden = self._count - len(self._lines)
        shown = (([f"... ({hidden} earlier lines)"] if hidden else []) + list(self._lines)
                 + [f"[rank {rank}] {bar}" for rank, bar in sorted(bars.items()) if bar.strip()])
        self._display("\n".join(shown) if shown else self._status)

    def status(self, text: str) -> None:
        self._status = text
        if not self._count:
            self._display(text)

    def _display(self, text: str) -> None:
        if text == self._text:
            return
        self._text = text
        if self._handle is None:
            from IPython.display import display

            self._handle = display({"text/plain": text}, raw=True, display_id=True)
        else:
            self._handle.update({"text/plain": text}, raw=True)

    def close(self) -> None:
        if self._handle is not None:
            self._handle.update({}, raw=True)  # an empty display shows nothing
            self._handle = None


class TerminalView:
    """Lines printed as they arrive; the ranks' progress bars redrawn together on the last line."""

    relay_at_end = False

    def __init__(self, stream: IO[str]):
        self._stream = stream
        self._status = ""  # what the last line shows now: the bars, or a note
        self._note = ""
        self._bars = ""

    def show(self, new: Sequence[tuple[int, str]], bars: dict[int, str]) -> None:
        if new:
            self._note = ""  # the ranks speak for themselves now
        self._bars = "  ".join(f"[rank {rank}] {bar}" for rank, bar in sorted(bars.items()) if bar.strip())
        self._draw(new)

    def status(self, text: str) -> None:
        self._note = text
        self._draw([])

    def _draw(self, new: Sequence[tuple[int, str]]) -> None:
        # cut to the terminal's width: a wrapped line could not be redrawn
        status = (self._bars or self._note)[:shutil.get_terminal_size().columns - 1]
        if not new and status == self._status:
            return
        out = "\r\x1b[K" if self._status else ""  # erase the bar line, write over it
        out += "".join(f"[rank {rank}] {line}\n" for rank, line in new) + status
        self._stream.write(out)
        self._stream.flush()
        self._status = status

    def close(self) -> None:
        if self._status:
            self._stream.write("\r\x1b[K")
            self._stream.flush()
            self._status = ""


def choose_view(live: bool | None = None) -> LiveView | None:
    """The view for this caller; ``live`` True or False overrides the choice (None: choose)."""
    if live is False:
        return None
    kernel = _jupyter_kernel()
    if kernel is not None:
        return JupyterView() if live or _someone_watches(kernel) else None
    if live or _isatty(sys.stdout):
        return TerminalView(sys.stdout)
    return None


def _jupyter_kernel() -> Any:
    ipython = sys.modules.get("IPython")  # never imported here: a script would pay for it
    shell = ipython.get_ipython() if ipython is not None else None
    return getattr(shell, "kernel", None)  # a terminal IPython has no kernel


def _someone_watches(kernel: Any) -> bool:
    """True when the cell runs for a front end that can ask for ``input()``: a person, not nbconvert/nbval."""
    try:
        return bool(kernel.get_parent()["content"].get("allow_stdin"))
    except Exception:  # an ipykernel older than 6: assume headless, the stored output stays as it was
        return False


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # replaced by an object without it, or closed
        return False
