"""A pytest plugin for nbval (``make nbval``, ``make nbval-portable``, ``make test-versions``):
a notebook's kernel that dies before it has run a cell is started again, up to 3 times.

Seen in CI once (stop 45): notebook 14's kernel died before replying to ``kernel_info``, while
another notebook ran beside it, and nbval (which sends the kernel's stderr to /dev/null) turned
that into 23 errors with no reason given. No cell had run, so a second start changes nothing that
nbval compares. Each failed start is printed with the last lines the kernel wrote to stderr, so a
kernel that keeps dying says why. Loaded with ``-p tests.nbval_kernel_retry`` (the Makefile's NBVAL).
"""

from __future__ import annotations

import sys
import tempfile

import nbval.kernel
import nbval.plugin

TRIES = 3


def said(stderr) -> str:
    """The last lines a kernel wrote to its stderr file, on one line."""
    stderr.seek(0)
    lines = stderr.read().decode(errors="replace").strip().splitlines()
    return " | ".join(lines[-3:]) or "nothing on stderr"


class RetryingKernel(nbval.kernel.RunningKernel):
    """nbval's RunningKernel, started again when the start fails (nbval's own start otherwise)."""

    def __init__(self, kernel_name: str, cwd: str | None = None, startup_timeout: int = 60) -> None:
        for attempt in range(1, TRIES + 1):
            # the kernel keeps this file as its stderr; unlinked already, it goes when the kernel does
            stderr = tempfile.TemporaryFile()
            self.km = None
            try:
                self.km, self.kc = nbval.kernel.start_new_kernel(
                    startup_timeout=startup_timeout, kernel_name=kernel_name, stderr=stderr, cwd=cwd)
                self._ensure_iopub_up()
                stderr.close()
                return
            except RuntimeError as err:
                if self.km is not None and self.km.is_alive():  # started, but its channels never came up
                    self.kc.stop_channels()
                    self.km.shutdown_kernel(now=True)
                why = said(stderr)
                stderr.close()
                if attempt == TRIES:
                    raise RuntimeError(f"{err} ({TRIES} starts; the kernel's stderr: {why})") from err
                print(f"\nnbval: the kernel for a notebook in {cwd} failed to start ({err}; its stderr: {why});"
                      f" starting it again ({attempt + 1}/{TRIES})", file=sys.stderr)


def pytest_configure(config) -> None:
    nbval.plugin.RunningKernel = RetryingKernel
