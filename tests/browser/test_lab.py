"""The learner's JupyterLab in a real browser: `make lab-test`.

Starts this venv's JupyterLab on 127.0.0.1 (a token, a free port) with throwaway runtime, config,
data, settings and workspace folders, over a *copy* of notebooks/ in a temporary folder (the
learner's files and Jupyter state are never touched), and drives Debian's headless Chromium
through selenium (``chromium.py``) the way a learner clicks:

1. notebook 00 opens with its kernel and no dialog, is not marked modified, and saved without
   running is byte-identical to the committed file;
2. Run > Run All Cells: no error output, the ``[rank N]`` lines in the page, torchrun's
   one-line status while its cell runs;
3. a scratch notebook with a long 2-rank cell: rank lines appear while it runs, the toolbar's
   interrupt ends it within 2 s with the one-line message and a traceback of the cell alone,
   Run All stops there, no rank is left, and the kernel then answers ``1 + 1``;
4. shut down, JupyterLab leaves no process behind.

Screenshots for review go to build/lab-screenshots/.

    make lab-test
    .venv/bin/python -m pytest -v -s tests/browser/test_lab.py
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import chromium
import pytest

ROOT = Path(__file__).resolve().parents[2]
LAUNCH_WORKERS = ROOT / "tests" / "infra"  # launch_workers: the spawn targets the scratch notebook runs
SCREENSHOTS = ROOT / "build" / "lab-screenshots"
NOTEBOOK = "00_start_here.ipynb"
INTERRUPTED = "LaunchInterrupted: ranks 0-1 stopped, nothing left running"

if chromium.missing():  # make lab-test asked for the browser: say what is missing, never skip quietly
    pytest.fail(chromium.missing(), pytrace=False)
sys.path.insert(0, str(ROOT))
from ddp_tutorial.launch import free_port  # noqa: E402  (after the sys.path line above)
from ddp_tutorial.launch.procs import descendants  # noqa: E402  (after the sys.path line above)
from ddp_tutorial.pitfalls.strays import alive  # noqa: E402  (after sys.path; alive: exists and is not a zombie)

# Runs in the page: the open notebook's cells as the learner sees them.
CELLS = r"""
const panel = document.querySelector(".jp-NotebookPanel:not(.lm-mod-hidden)");
if (!panel) return null;
const status = panel.querySelector(".jp-Notebook-ExecutionIndicator");
return {
  kernel: status ? status.getAttribute("data-status") : "",
  dirty: !!document.querySelector(".lm-TabBar-tab.jp-mod-current.jp-mod-dirty"),
  dialogs: Array.from(document.querySelectorAll(".jp-Dialog")).map(d => d.innerText),
  cells: Array.from(panel.querySelectorAll(".jp-Cell")).map(c => ({
    code: c.classList.contains("jp-CodeCell"),
    prompt: (c.querySelector(".jp-InputPrompt") || {innerText: ""}).innerText.trim(),
    input: (c.querySelector(".jp-InputArea-editor") || {innerText: ""}).innerText,
    output: (c.querySelector(".jp-OutputArea") || {innerText: ""}).innerText,
  })),
};
"""


class Lab:
    """JupyterLab on a copy of the notebooks, and a browser on it."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="ddp-tutorial-lab-"))
        self.notebooks = self.dir / "notebooks"
        shutil.copytree(ROOT / "notebooks", self.notebooks, ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
        self.token, self.port = secrets.token_hex(16), free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.server: subprocess.Popen | None = None
        self.started: set[int] = set()  # every process seen below the server: none may outlive it

    def start(self) -> None:
        jupyter = {name: str(self.dir / name) for name in ("runtime", "config", "data", "settings", "workspaces",
                                                            "ipython")}
        env = dict(os.environ, JUPYTER_RUNTIME_DIR=jupyter["runtime"], JUPYTER_CONFIG_DIR=jupyter["config"],
                   JUPYTER_DATA_DIR=jupyter["data"], JUPYTERLAB_SETTINGS_DIR=jupyter["settings"],
                   JUPYTERLAB_WORKSPACES_DIR=jupyter["workspaces"], IPYTHONDIR=jupyter["ipython"])
        # No "get Jupyter news?" toast over the page (it would only be declined). Every cell in
        # the page, not only those scrolled into view (JupyterLab's default renders the others
        # when they are scrolled to), so that the test reads them all.
        settings = {"apputils-extension/notification": {"fetchNews": "false", "checkForUpdates": False},
                    "notebook-extension/tracker": {"windowingMode": "none"}}
        for name, values in settings.items():
            path = Path(jupyter["settings"], "@jupyterlab", f"{name}.jupyterlab-settings")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(values))
        cmd = [str(Path(sys.executable).parent / "jupyter"), "lab", "--no-browser", "--ip=127.0.0.1",
               f"--port={self.port}", f"--IdentityProvider.token={self.token}",
               f"--ServerApp.root_dir={self.notebooks}",
               "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
        if os.geteuid() == 0:  # a container, CI: JupyterLab refuses root without it
            cmd.append("--allow-root")
        self.log = open(self.dir / "jupyterlab.log", "w")
        self.server = subprocess.Popen(cmd, env=env, cwd=self.notebooks, stdout=self.log,
                                       stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert self.server.poll() is None, "JupyterLab exited:\n" + self.server_log()
            try:
                request = urllib.request.Request(f"{self.base}/api/status",
                                                 headers={"Authorization": f"token {self.token}"})
                urllib.request.urlopen(request, timeout=2).close()
                return
            except OSError:
                time.sleep(0.3)
        pytest.fail("JupyterLab did not answer within 60 s:\n" + self.server_log())

    def note_processes(self) -> set[int]:
        """The processes below the server now (kernels, launchers, ranks); remembered."""
        found = set(descendants(self.server.pid)) if self.server else set()
        self.started |= found
        return found

    def stop(self) -> None:
        """Shut JupyterLab down (it shuts its kernels down), then anything left: always."""
        if self.server is None:
            return
        self.note_processes()
        if self.server.poll() is None:
            os.killpg(self.server.pid, signal.SIGTERM)
            try:
                self.server.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.server.pid, signal.SIGKILL)
                self.server.wait(10)
        deadline = time.monotonic() + 10
        while [p for p in self.started if alive(p)] and time.monotonic() < deadline:
            time.sleep(0.1)
        self.left = sorted(p for p in self.started if alive(p))
        for pid in self.left:  # reported by the last test; never left running
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.server = None
        self.log.close()

    def server_log(self) -> str:
        return (self.dir / "jupyterlab.log").read_text()[-4000:]


@pytest.fixture(scope="module")
def lab():
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    lab = Lab()
    try:
        lab.start()
        with chromium.browser(width=1280, height=1000) as driver:
            driver.set_script_timeout(30)
            lab.driver = driver
            yield lab
    finally:
        lab.stop()
        shutil.rmtree(lab.dir, ignore_errors=True)


def open_notebook(lab: Lab, name: str) -> dict:
    """Open ``name`` from the file's URL and wait until its cells are shown and its kernel is idle."""
    count = len(json.loads((lab.notebooks / name).read_text())["cells"])
    # ?reset: a fresh workspace, this notebook the only tab (no other one to take the menu's commands)
    lab.driver.get(f"{lab.base}/lab/tree/{name}?reset&token={lab.token}")
    return wait_for(lab, lambda page: page and page["kernel"] == "idle" and len(page["cells"]) == count
                    and all(c["input"].strip() for c in page["cells"]), 90, f"{name} with an idle kernel")


def wait_for(lab: Lab, condition, timeout: float, what: str, every: float = 0.2) -> dict:
    deadline = time.monotonic() + timeout
    page = None
    while time.monotonic() < deadline:
        page = lab.driver.execute_script(CELLS)
        if condition(page):
            return page
        time.sleep(every)
    shot(lab, "timeout.png")
    pytest.fail(f"waited {timeout:g} s for {what}; the page: {json.dumps(page)[:3000]}\n{lab.server_log()}")


def click(lab: Lab, css: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(lab.driver, 20).until(expected_conditions.element_to_be_clickable((By.CSS_SELECTOR, css))).click()


def run_all_from_the_menu(lab: Lab) -> None:
    from selenium.webdriver.common.by import By

    # a click in the notebook first, as a learner's: the Run menu acts on the notebook with the focus
    lab.driver.execute_script("document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-Cell "
                              ".jp-InputPrompt').click();")
    run = next(e for e in lab.driver.find_elements(By.CSS_SELECTOR, ".lm-MenuBar-item") if e.text.strip() == "Run")
    run.click()
    click(lab, '.lm-Menu-item[data-command="runmenu:run-all"]')


def toolbar(lab: Lab, command: str) -> None:
    click(lab, f'.jp-NotebookPanel:not(.lm-mod-hidden) .jp-NotebookPanel-toolbar [data-command="{command}"]')


def save(lab: Lab, path: Path) -> None:
    """The toolbar's save button; returns once the server wrote ``path``."""
    before = path.stat().st_mtime_ns
    toolbar(lab, "docmanager:save")
    deadline = time.monotonic() + 20
    while path.stat().st_mtime_ns == before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert path.stat().st_mtime_ns != before, "JupyterLab did not save " + path.name
    wait_for(lab, lambda page: not page["dirty"], 10, "the saved notebook not to be marked modified")


def shot(lab: Lab, name: str) -> None:
    lab.driver.save_screenshot(str(SCREENSHOTS / name))
    print(f"screenshot: {SCREENSHOTS / name}")


def scroll_to(lab: Lab, text: str) -> None:
    lab.driver.execute_script(
        "const o = Array.from(document.querySelectorAll('.jp-OutputArea')).find(e => e.innerText.includes(arguments[0]));"
        "if (o) o.scrollIntoView({block: 'center'});", text)


def running(cell: dict) -> bool:
    return cell["prompt"] == "[*]:"


def test_the_notebook_opens_unmodified_and_saves_byte_identical(lab):
    original = (ROOT / "notebooks" / NOTEBOOK).read_bytes()
    page = open_notebook(lab, NOTEBOOK)
    shot(lab, "00-opened.png")
    assert not page["dialogs"], f"a dialog on opening (kernel choice?): {page['dialogs']}"
    time.sleep(2)  # what the kernel's first reply changes (language_info) lands now, if anything
    page = lab.driver.execute_script(CELLS)
    assert not page["dirty"], "opening the notebook marked it modified"
    save(lab, lab.notebooks / NOTEBOOK)
    saved = (lab.notebooks / NOTEBOOK).read_bytes()
    assert saved == original, "opened and saved unrun, the notebook changed: git status would show it"


def test_run_all_shows_rank_lines_and_no_error(lab):
    page = open_notebook(lab, NOTEBOOK)
    torchrun_cell = next(i for i, c in enumerate(page["cells"]) if 'torchrun("ddp_tutorial.comm.hello"' in c["input"])
    run_all_from_the_menu(lab)
    started = time.monotonic()
    torchrun_live = []  # what the torchrun cell showed while it ran
    seen_running = []  # the stored prompts are numbers already: done means [*] came and went

    def finished(page) -> bool:
        seen_running.extend(i for i, c in enumerate(page["cells"]) if running(c))
        if not seen_running:
            return False
        cell = page["cells"][torchrun_cell]
        if running(cell) and cell["output"].strip():
            torchrun_live.append(cell["output"].strip())
            if len(torchrun_live) == 1:
                scroll_to(lab, cell["output"].strip())
                shot(lab, "00-torchrun-starting.png")
        code = [c for c in page["cells"] if c["code"]]
        return page["kernel"] == "idle" and all(c["prompt"][1:-2].isdigit() for c in code)

    page = wait_for(lab, finished, 240, "Run All to finish notebook 00", every=0.1)
    print(f"notebook 00, Run All: {time.monotonic() - started:.1f} s")
    text = "\n".join(c["output"] for c in page["cells"])
    for line in ("[rank 0] hello from rank 0 of 2, holding 0", "[rank 1] after all_reduce rank 1 holds 1",
                 "[rank 3] after all_reduce rank 3 holds 6", "exit code: 0"):
        assert line in text, f"{line!r} is not in the page"
    scroll_to(lab, "[rank 0] hello from rank 0 of 2")
    shot(lab, "00-run-all.png")
    assert torchrun_live and torchrun_live[0].startswith("starting torchrun with 2 processes"), \
        f"the torchrun cell showed nothing while it ran: {torchrun_live[:3]}"
    assert not page["cells"][torchrun_cell]["output"].startswith(("starting", "torchrun:")), \
        "torchrun's status line stayed after the cell finished"
    save(lab, lab.notebooks / NOTEBOOK)  # the model JupyterLab holds, outputs and all
    cells = json.loads((lab.notebooks / NOTEBOOK).read_text())["cells"]
    errors = [o for c in cells if c["cell_type"] == "code" for o in c["outputs"] if o["output_type"] == "error"]
    assert not errors, [f"{e['ename']}: {e['evalue']}" for e in errors]


def test_the_toolbar_interrupt_stops_a_long_cell_calmly(lab, tmp_path):
    import nbformat

    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    scratch = nbformat.v4.new_notebook(metadata={"kernelspec": {
        "display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}})
    scratch.cells = [
        nbformat.v4.new_code_cell(f"import sys\nsys.path.insert(0, {str(LAUNCH_WORKERS)!r})\nimport launch_workers as w\n"
                                  "from ddp_tutorial.launch import spawn"),
        nbformat.v4.new_code_cell(f"spawn(w.tick, 2, args=(600, {str(pid_dir)!r}), timeout=900)"),
        nbformat.v4.new_code_cell("1 + 1"),
    ]
    nbformat.write(scratch, lab.notebooks / "scratch_interrupt.ipynb")
    open_notebook(lab, "scratch_interrupt.ipynb")
    run_all_from_the_menu(lab)
    # the ranks' lines, live, while the cell runs
    page = wait_for(lab, lambda p: running(p["cells"][1]) and "[rank 1] tick 1 of rank 1" in p["cells"][1]["output"],
                    90, "rank lines while the long cell runs")
    assert "[rank 0] tick 1 of rank 0" in page["cells"][1]["output"]
    pids = [int(p.read_text()) for p in pid_dir.glob("*.pid")]
    assert len(pids) == 2 and all(alive(p) for p in pids), pids
    lab.note_processes()
    shot(lab, "scratch-running.png")
    toolbar(lab, "notebook:interrupt-kernel")
    clicked = time.monotonic()
    # 60 s: a hang guard, not a speed claim. The launcher gives the ranks 1 s after SIGTERM and 5 s
    # after SIGKILL, and a loaded 2-core machine adds seconds; left running, they would tick for 600 s.
    page = wait_for(lab, lambda p: not running(p["cells"][1]) and INTERRUPTED in p["cells"][1]["output"], 60,
                    "the interrupted cell to end with the one-line message", every=0.05)
    print(f"interrupt -> cell ended: {time.monotonic() - clicked:.2f} s")  # for the log, not asserted
    shot(lab, "scratch-interrupted.png")
    output = page["cells"][1]["output"]
    message = output[output.index("LaunchInterrupted"):]  # the traceback: header, the cell, the message
    for noise in ("multiprocessing", "selectors", "spawner.py", "_launch_once", "File "):
        assert noise not in message, f"the traceback shows {noise!r}:\n{message}"
    assert len(message.strip().splitlines()) <= 6, message
    assert not [p for p in pids if alive(p)], "ranks outlived the interrupt that said they stopped"
    assert page["cells"][2]["prompt"] == "[ ]:", "Run All went on past the interrupt"
    # the kernel lives on: run the last cell by itself
    lab.driver.execute_script(
        "document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-Cell')[2]"
        ".querySelector('.jp-InputPrompt').click();")
    toolbar(lab, "notebook:run-cell-and-select-next")
    page = wait_for(lab, lambda p: p["cells"][2]["prompt"][1:-2].isdigit(), 30, "the kernel to run 1 + 1")
    assert page["cells"][2]["output"].split() == ["[3]:", "2"], page["cells"][2]  # its prompt, its result
    shot(lab, "scratch-after.png")


def test_no_process_outlives_jupyterlab(lab):
    lab.note_processes()
    assert lab.started, "no kernel was seen below the server"
    lab.stop()
    assert not lab.left, f"left running after JupyterLab shut down: {lab.left}"
