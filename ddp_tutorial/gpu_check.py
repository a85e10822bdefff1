"""``python -m ddp_tutorial.gpu_check`` (``make gpu-check``): the course checked on this machine's CUDA GPUs.

Runs every item of the README's "Checked on a GPU" (``gpu_items``) that this machine's GPU count allows, each an
asserted command (exit 0, and the lines it must print), every one even when another fails; prints
a table (item, result, seconds) and writes ``build/gpu-check/report.md``: the machine, the table,
the tail of each failure, and what lessons 01, 07, 11 and 14 printed on the GPU (their cell
``nbtools.gpu_run_output`` shows it once the report is committed as ``docs/gpu-check/<name>``).
Exit 1 when an item failed. Without CUDA it says so in one line and exits 0.

    python -m ddp_tutorial.gpu_check            # everything this machine's GPUs allow
    python -m ddp_tutorial.gpu_check --list     # the items and the GPUs each needs (any machine)
    python -m ddp_tutorial.gpu_check --only nccl --only doctor   # the items whose name holds one
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ddp_tutorial.gpu_items import ITEMS, SUITES, Item
from ddp_tutorial.launch import free_port, run_command
from ddp_tutorial.nbtools import GPU_REPORTS, LESSONS_HEADING, lesson_section, shown_on_gpu

ROOT = Path(__file__).resolve().parent.parent
OUT = "build/gpu-check"


@dataclass(frozen=True)
class ItemResult:
    """What one item gave: passed, FAILED (with its output's tail) or needs N GPUs."""

    name: str
    status: str  # "passed", "FAILED" or "needs N GPUs"
    seconds: float | None = None
    tail: str = ""


def notebook_items(out: str = OUT, root: Path = ROOT) -> list[Item]:
    """``make notebooks`` one lesson at a time into build/gpu-check/notebooks, never the committed ones.

    A failing assert, or any error in a cell not tagged ``raises-exception``, fails the lesson."""
    return [Item(f"lesson {nb.stem} executes, its asserts hold", 1, (
        "{python}", "-m", "nbconvert", "--to", "notebook", "--execute", "--output-dir", f"{out}/notebooks",
        "--ExecutePreprocessor.timeout=600", "--ExecutePreprocessor.record_timing=False",
        f"notebooks/{nb.name}"), timeout=1200) for nb in sorted((root / "notebooks").glob("*.ipynb"))]


def judge(item: Item, returncode: int, output: str) -> str:
    """Why ``item`` failed ('' when it passed): its exit code, or the first expected line it lacks."""
    if returncode != 0:
        return f"exit code {returncode}"
    missing = [e for e in item.expect if e not in output]
    return f"printed no {missing[0]!r}" if missing else ""


def needs(item: Item, gpus: int) -> str:
    """'needs N GPUs' when this machine has fewer than the item needs, else ''."""
    return f"needs {item.min_gpus} GPUs" if gpus < item.min_gpus else ""


def run_item(item: Item, gpus: int, logs: Path = ROOT / OUT / "logs") -> ItemResult:
    """Run one item (or skip it for want of GPUs); its whole output goes to a file in ``logs``."""
    if needs(item, gpus):
        return ItemResult(item.name, needs(item, gpus))
    port = str(free_port())  # chosen now, just before the item runs: a torchrun item's --master-port
    command = [sys.executable if part == "{python}" else part.replace("{port}", port) for part in item.command]
    env = dict(os.environ, DDP_TUTORIAL_EXERCISES_FRESH="1", PYTHONHASHSEED="0")
    env.setdefault("OMP_NUM_THREADS", "1")
    start = time.perf_counter()
    try:  # launch.run_command: its own session, so a timeout (or Ctrl-C) ends what it started too
        result = run_command(command, timeout=item.timeout, env=env, name=item.name, cwd=str(ROOT))
        output, code = result.output, result.returncode
    except TimeoutError as err:
        output, code = f"{err}\ntimed out after {item.timeout:.0f} s", 124
    seconds = time.perf_counter() - start
    log = logs / (re.sub(r"\W+", "_", item.name)[:80] + ".log")
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(output)
    why = judge(item, code, output)
    tail = "\n".join(output.rstrip().splitlines()[-40:] + [f"-> {why}"]) if why else ""
    return ItemResult(item.name, "FAILED" if why else "passed", seconds, tail)


def machine(names: list[str]) -> dict[str, str]:
    """This machine (GPU ``names``), its driver, CUDA, NCCL, torch and Python, for the report."""
    import platform

    import torch

    try:
        driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=60).stdout.split("\n")[0].strip()
    except (OSError, subprocess.SubprocessError):
        driver = ""
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                text=True, timeout=60).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    nccl = torch.cuda.nccl.version() if torch.distributed.is_nccl_available() else "none"
    nccl = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)  # (2, 21, 5); an int in old releases
    return {"GPUs": f"{len(names)} x {', '.join(sorted(set(names)))}", "GPU names": ", ".join(names),
            "driver": driver or "unknown", "CUDA (torch's)": str(torch.version.cuda), "NCCL": nccl,
            "torch": torch.__version__, "Python": platform.python_version(), "CPU cores": str(os.cpu_count()),
            "commit": commit or "unknown"}


def table(results: list[ItemResult]) -> str:
    """The results as a Markdown table: item, result, seconds."""
    rows = ["| item | result | seconds |", "|---|---|---:|"]
    rows += [f"| {r.name} | {r.status} | {'' if r.seconds is None else f'{r.seconds:.1f}'} |" for r in results]
    return "\n".join(rows)


def report_name(date: datetime.date, gpu_names: list[str]) -> str:
    """The report's name in docs/gpu-check: ``<date>-<count>x-<gpu>.md``, e.g. 2026-11-25-1x-nvidia-h200.md."""
    gpu = re.sub(r"[^a-z0-9]+", "-", (gpu_names[0] if gpu_names else "no-gpu").lower()).strip("-")
    return f"{date.isoformat()}-{len(gpu_names)}x-{gpu}.md"


def report(info: dict[str, str], results: list[ItemResult], lessons: dict[str, str], date: datetime.date) -> str:
    """The report: its first line names the machine (``nbtools.gpu_run_output`` shows it), then the
    machine, the table, each failure's tail and the lessons' GPU output."""
    failed = [r for r in results if r.status == "FAILED"]
    waiting = [r for r in results if r.status.startswith("needs")]
    lines = [f"# make gpu-check on {info['GPUs']}, {date.isoformat()}", "", "## Machine", ""]
    lines += [f"- {key}: {value}" for key, value in info.items()]
    lines += ["", "## Results", "", f"{len(results) - len(failed) - len(waiting)} passed, {len(failed)} failed, "
              f"{len(waiting)} wait for a machine with more GPUs.", "", table(results), ""]
    if failed:
        lines += ["## Failures", ""]
        for r in failed:
            lines += [f"### {r.name}", "", "````text", r.tail, "````", ""]
    lines += [LESSONS_HEADING, ""]
    lines += [lesson_section(lesson, text) for lesson, text in sorted(lessons.items())] or ["(no lesson ran)"]
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ddp_tutorial.gpu_check", description=__doc__.split("\n")[0])
    parser.add_argument("--list", action="store_true", help="list the items and the GPUs each needs")
    parser.add_argument("--only", action="append", metavar="TEXT", help="run the items whose name holds TEXT")
    parser.add_argument("--out", default=OUT, help=f"the report, logs and executed lessons (default {OUT})")
    args = parser.parse_args(argv)
    out = ROOT / args.out
    items = [i for i in ITEMS + notebook_items(str(out)) + SUITES if not args.only or any(t in i.name for t in args.only)]
    if args.list:
        for item in items:
            print(f"{item.min_gpus} GPU(s)  {item.name}")
        return 0
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus == 0:
        print(f"gpu-check: no CUDA GPU on this machine (torch {torch.__version__}): nothing to check here; "
              "run it on a machine with one (README, 'Checked on a GPU')")
        return 0
    names = [torch.cuda.get_device_name(i) for i in range(gpus)]
    info, results = machine(names), []
    for old in (out / "notebooks", out / "logs"):  # no lesson output or log of an earlier run
        for path in old.glob("*"):
            path.unlink()
    print(f"gpu-check: {len(items)} items on {info['GPUs']}; each one's output in {args.out}/logs/", flush=True)
    for n, item in enumerate(items, 1):
        results.append(run_item(item, gpus, out / "logs"))
        r = results[-1]
        print(f"[{n}/{len(items)}] {r.status:12s} {'' if r.seconds is None else f'{r.seconds:7.1f} s'}  {r.name}",
              flush=True)
    lessons = {}
    for nb in sorted((out / "notebooks").glob("*.ipynb")):
        lessons.update(shown_on_gpu(json.loads(nb.read_text())))
    today = datetime.date.today()
    (out / "report.md").write_text(report(info, results, lessons, today))
    print("\n" + table(results) + f"\n\nthe report: {args.out}/report.md; commit it as "
          f"{GPU_REPORTS}/{report_name(today, names)}")
    return 1 if any(r.status == "FAILED" for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
