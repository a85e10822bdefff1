"""``python -m ddp_tutorial.gpu_check`` (``make gpu-check``): the course checked on this machine's CUDA GPUs.

Runs every item of the README's "Checked on a GPU" that this machine's GPU count allows, each an
asserted command (exit 0, and the lines it must print), every one even when another fails; prints
a table (item, result, seconds) and writes ``build/gpu-check/report.md``: the machine, the table,
the tail of each failure, and what lessons 01, 06, 10 and 13 printed on the GPU (their cell
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

from ddp_tutorial.launch import run_command
from ddp_tutorial.nbtools import GPU_REPORTS, LESSONS_HEADING, lesson_section, shown_on_gpu

ROOT = Path(__file__).resolve().parent.parent
OUT = "build/gpu-check"
TORCHRUN = ("{python}", "-m", "torch.distributed.run", "--standalone")  # torchrun, on a free local port
PYTEST = ("{python}", "-m", "pytest", "-p", "no:cacheprovider", "-q")


@dataclass(frozen=True)
class Item:
    """One check: ``command`` ({python} is this interpreter) must exit 0 and print every ``expect``."""
    name: str
    min_gpus: int
    command: tuple[str, ...]
    expect: tuple[str, ...] = ()
    timeout: float = 600.0


@dataclass(frozen=True)
class ItemResult:
    """What one item gave: passed, FAILED (with its output's tail) or needs N GPUs."""

    name: str
    status: str  # "passed", "FAILED" or "needs N GPUs"
    seconds: float | None = None
    tail: str = ""


def tests(*node_ids: str) -> tuple[str, ...]:
    return PYTEST + node_ids


ITEMS = [
    Item("doctor: one rank on nccl/cuda:0", 1, ("{python}", "-m", "ddp_tutorial", "--world-size", "1"),
         ("backend=nccl, device=cuda:LOCAL_RANK", "1-rank all_reduce through launch.spawn: OK")),
    Item("doctor: two ranks on nccl", 2, ("{python}", "-m", "ddp_tutorial"),
         ("backend=nccl, device=cuda:LOCAL_RANK", "2-rank all_reduce through launch.spawn: OK")),
    Item("1 GPU: a world of one on nccl/cuda:0, sub-groups too", 1, tests(
        "tests/infra/test_launch.py::test_hello_runs_alone_as_a_world_of_one",
        "tests/comm/test_process_groups.py::test_subgroups_reduce_only_inside_their_group[1]")),
    Item("1 GPU: training, 1 process on nccl/cuda:0 and 2 on gloo", 1, tests(
        "tests/training/test_train.py::test_bench_train_tiny_run_is_well_formed")),
    Item("1 GPU: deterministic training is bitwise equal", 1, tests(
        "tests/training/test_train.py::test_seed_fixes_the_result_and_lr_zero_keeps_the_initial_weights")),
    Item("1 GPU: train twice from a shell, same weights", 1, ("{python}", "-c", (
        "import subprocess, sys, tempfile\n"
        "from ddp_tutorial.training.checkpoint import load_checkpoint, same_weights\n"
        "with tempfile.TemporaryDirectory() as d:\n"
        "    for name in 'ab':\n"
        "        subprocess.run([sys.executable, '-m', 'ddp_tutorial.training.train', '--epochs', '1',\n"
        "                        '--checkpoint', f'{d}/{name}.pt'], check=True)\n"
        "    a, b = (load_checkpoint(f'{d}/{n}.pt')['model'] for n in 'ab')\n"
        "    print('same_weights:', same_weights(a, b))\n")), ("same_weights: True",)),
    Item("1 GPU: map_location puts a checkpoint on its rank's device", 1, tests(
        "tests/pitfalls/test_pitfalls.py::test_checkpoint_pitfalls")),
    Item("2 GPUs: every 2-rank spawn on nccl (p2p, groups, collectives, DDP, training)", 2, tests(
        "tests/comm/test_p2p.py", "tests/comm/test_process_groups.py", "tests/comm/test_collectives.py",
        "tests/data_parallel/test_ddp_spawn.py", "tests/data_parallel/test_ddp_from_scratch.py",
        "tests/training/test_train.py")),
    Item("2 GPUs: the pitfalls' tests on nccl", 2, tests("tests/pitfalls/test_pitfalls.py")),
    Item("2 GPUs: the pitfalls print an 'on nccl:' line", 2, ("{python}", "-m", "ddp_tutorial.pitfalls"),
         ("  on nccl: ",)),
    Item("2 GPUs: uneven inputs end in the NCCL watchdog", 2, tests(
        "tests/data_parallel/test_ddp_spawn.py::test_uneven_inputs_without_join_hang_until_the_collective_timeout")),
    Item("4 GPUs: model parallel, each rank on its own two GPUs", 4, TORCHRUN + (
        "--nproc-per-node=2", "-m", "ddp_tutorial.pipeline_parallel.model_parallel"),
        ("rank 0 devices ['cuda:0', 'cuda:1']", "equals one-process training: True")),
    Item("4 GPUs: model parallel's tests", 4, tests("tests/pipeline_parallel/test_model_parallel.py")),
    Item("4 GPUs: tensor parallel on nccl", 4, TORCHRUN + (
        "--nproc-per-node=4", "-m", "ddp_tutorial.tensor_parallel.split_mlp"), ("OK: ",)),
    Item("4 GPUs: device mesh on nccl", 4, TORCHRUN + (
        "--nproc-per-node=4", "-m", "ddp_tutorial.tensor_parallel.device_mesh"), ("OK: ",)),
    Item("4 GPUs: ZeRO on nccl", 4, TORCHRUN + ("--nproc-per-node=4", "-m", "ddp_tutorial.sharding.zero"), ("OK (",)),
    Item("4 GPUs: FSDP2 on nccl", 4, TORCHRUN + ("--nproc-per-node=4", "-m", "ddp_tutorial.sharding.fsdp"), ("OK (",)),
    # lesson 19: the ring's batch_isend_irecv, Ulysses' all_to_all_single, SP's reduce-scatter, on nccl
    Item("2 GPUs: ring attention on nccl", 2, TORCHRUN + (
        "--nproc-per-node=2", "-m", "ddp_tutorial.context_parallel.ring_attention"), ("OK: ring attention over 2",)),
    Item("2 GPUs: zig-zag ring attention on nccl", 2, TORCHRUN + (
        "--nproc-per-node=2", "-m", "ddp_tutorial.context_parallel.zigzag"), ("OK: zig-zag",)),
    Item("2 GPUs: Ulysses on nccl", 2, TORCHRUN + (
        "--nproc-per-node=2", "-m", "ddp_tutorial.context_parallel.ulysses"), ("OK: Ulysses over 2",)),
    Item("2 GPUs: a Llama block, TP and TP + SP, on nccl", 2, TORCHRUN + (
        "--nproc-per-node=2", "-m", "ddp_tutorial.tensor_parallel.sequence_parallel"), ("+ sequence parallel over 2",)),
    Item("2 GPUs: the vocabulary split on nccl", 2, TORCHRUN + (
        "--nproc-per-node=2", "-m", "ddp_tutorial.tensor_parallel.vocab_parallel"), ("OK: vocabulary split",)),
    Item("2 GPUs: the Llama plan and loss_parallel on nccl", 2, TORCHRUN + (
        "--nproc-per-node=2", "-m", "ddp_tutorial.tensor_parallel.llama_plan"), ("OK: TinyLlama",)),
]


# The whole suites last: on a machine lent for minutes the specific items report first.
SUITES = [
    Item("unit tests (make unit)", 1, ("make", "unit"), timeout=1800),
    Item("nbval against the stored CPU outputs (make nbval)", 1, ("make", "nbval"), timeout=1800),
    Item("nbval on portable and AVX2 kernels (make nbval-portable)", 1, ("make", "nbval-portable"), timeout=3600),
]


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
    command = [sys.executable if part == "{python}" else part for part in item.command]
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
