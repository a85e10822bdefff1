"""Headless Chromium for the browser tests: `make site-test` (the website) and `make lab-test`
(the learner's JupyterLab).

Debian's `chromium` and `chromium-driver` are driven through selenium with the driver's path
given, so selenium never downloads a browser or a driver. The flags are the ones a closed,
root-run container needs: no sandbox (root), no GPU, and no background networking (Chromium
would otherwise try, and fail, to reach Google's hosts at every start).
"""
from __future__ import annotations

import contextlib
import http.server
import shutil
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
DEBIAN_PACKAGES = ("chromium", "chromium-driver")
FLAGS = (
    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-dev-shm-usage",
)


def missing() -> str | None:
    """Why a browser test cannot run here, or None when it can."""
    absent = [p for p in (CHROMIUM, CHROMEDRIVER) if not Path(p).exists()]
    if absent:
        return (f"{' and '.join(absent)} not found: install Debian's "
                f"{' and '.join(DEBIAN_PACKAGES)} (as root: apt-get update && "
                f"apt-get install -y --no-install-recommends {' '.join(DEBIAN_PACKAGES)})")
    try:
        import selenium  # noqa: F401  (only whether it imports)
    except ImportError:
        return "selenium is not installed in this Python (pip install 'selenium>=4.11')"
    return None


@contextlib.contextmanager
def browser(width: int = 1366, height: int = 900) -> Iterator[object]:
    """A selenium WebDriver on a fresh headless Chromium, quit (with its profile removed) on exit.

    The browser console is recorded: `driver.get_log("browser")` returns its entries.
    """
    reason = missing()
    if reason:
        raise RuntimeError(reason)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="ddp-tutorial-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={profile}")
    options.add_argument(f"--window-size={width},{height}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


class _LoggingHandler(http.server.SimpleHTTPRequestHandler):
    """Serves a folder and records (status, path) of every request instead of printing it."""

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        self.server.requests.append((int(code) if str(code).isdigit() else 0, self.path))

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (stdlib name)
        pass


class _QuietServer(http.server.ThreadingHTTPServer):
    """A browser drops connections it no longer needs (a page left mid-load): not an error."""

    def handle_error(self, request: object, client_address: object) -> None:
        import sys

        if not isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            super().handle_error(request, client_address)


@contextlib.contextmanager
def serve(folder: str | Path) -> Iterator[tuple[str, list[tuple[int, str]]]]:
    """Serve `folder` on 127.0.0.1 (a free port); yield (base URL, request log of (status, path))."""
    folder = str(folder)

    class Handler(_LoggingHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=folder, **kwargs)

    server = _QuietServer(("127.0.0.1", 0), Handler)
    server.requests = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", server.requests
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
