"""``make gpu-check``'s items (``ddp_tutorial.gpu_items``) exist, and its table, report and GPU-count logic hold with fake runs.

Also ``ddp_tutorial.nbtools``'s side of the report (``gpu_run_output``), read back from reports
written here, and the lessons' cells that call it.
"""

from __future__ import annotations

import ast
import datetime
import importlib
import importlib.util
import re
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest
import torch

from ddp_tutorial import gpu_check, nbtools
from ddp_tutorial.gpu_check import ITEMS, SUITES, Item, ItemResult

ROOT = Path(__file__).resolve().parents[2]
ALL = ITEMS + gpu_check.notebook_items() + SUITES
LESSONS_WITH_A_GPU_CELL = ("01_data_parallel", "07_ddp_spawn", "11_train_end_to_end", "14_sharding")


def test_items_cover_every_gpu_count_and_every_lesson():
    assert len({i.name for i in ALL}) == len(ALL)
    assert {i.min_gpus for i in ALL} == {1, 2, 4, 8}
    assert len(gpu_check.notebook_items()) == len(list((ROOT / "notebooks").glob("*.ipynb"))) >= 16


@pytest.mark.slow  # collects the whole suite in a subprocess (about 20 s)
def test_every_named_test_is_collected():
    node_ids = [part for i in ALL if i.command[:3] == ("{python}", "-m", "pytest")
                for part in i.command if part.startswith("tests/")]
    assert len(node_ids) >= 10
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--collect-only", "-q",
                           *node_ids], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    collected = set(done.stdout.splitlines())
    for node in node_ids:
        assert node in collected or any(c.startswith(node + "::") for c in collected), node


def test_every_command_names_a_module_target_notebook_or_name_that_exists():
    makefile = (ROOT / "Makefile").read_text()
    for item in ALL:
        command = item.command
        if command[0] == "make":
            assert re.search(rf"^{re.escape(command[1])}:", makefile, re.M), item.name
            continue
        assert command[0] == "{python}", item.name
        if command[1] == "-c":  # the code compiles and every name it imports from the course exists
            for node in ast.walk(ast.parse(command[2])):
                if isinstance(node, ast.ImportFrom):
                    module = importlib.import_module(node.module)
                    assert all(hasattr(module, a.name) for a in node.names), (item.name, node.module)
            continue
        modules = [command[k + 1] for k, part in enumerate(command) if part == "-m"]
        assert modules and all(importlib.util.find_spec(m) is not None for m in modules), (item.name, modules)
        if "nbconvert" in modules:
            assert (ROOT / command[-1]).is_file() and "--inplace" not in command, item.name


def test_needs_lists_items_beyond_the_gpus_present():
    item = Item("tp", 4, ("false",))
    assert [gpu_check.needs(item, gpus) for gpus in (1, 2, 3, 4, 8)] == ["needs 4 GPUs"] * 3 + ["", ""]
    skipped = gpu_check.run_item(item, 2)  # `false` would fail: it is never started
    assert skipped == ItemResult("tp", "needs 4 GPUs")


def test_judge_wants_exit_zero_and_every_expected_line():
    item = Item("x", 1, ("true",), ("OK: ", "nccl"))
    assert gpu_check.judge(item, 0, "OK: 4 ranks on nccl\n") == ""
    assert gpu_check.judge(item, 3, "OK: 4 ranks on nccl\n") == "exit code 3"
    assert gpu_check.judge(item, 0, "FAILED: 4 ranks on nccl\n") == "printed no 'OK: '"


def test_run_item_passes_fails_and_keeps_the_log(tmp_path):
    ok = gpu_check.run_item(Item("ok one", 1, ("{python}", "-c", "print('OK: fine')"), ("OK: ",)), 1, tmp_path)
    assert (ok.status, ok.tail) == ("passed", "") and ok.seconds >= 0
    assert (tmp_path / "ok_one.log").read_text() == "OK: fine\n"
    bad = gpu_check.run_item(Item("bad", 1, ("{python}", "-c", "print('boom'); raise SystemExit(3)")), 1, tmp_path)
    assert bad.status == "FAILED" and bad.tail.splitlines() == ["boom", "-> exit code 3"]


RESULTS = [ItemResult("doctor", "passed", 3.04), ItemResult("fsdp", "needs 4 GPUs"), ItemResult("lesson 14", "FAILED", 12.0,
                                                                                    "AssertionError\n-> exit code 1")]
INFO = {"GPUs": "1 x NVIDIA H200", "GPU names": "NVIDIA H200", "driver": "570.1", "CUDA (torch's)": "12.8",
        "torch": "2.8.0"}
DAY = datetime.date(2026, 11, 25)


def test_table_has_one_row_per_item_with_its_result_and_seconds():
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in gpu_check.table(RESULTS).splitlines()]
    assert rows[0] == ["item", "result", "seconds"]
    assert rows[2:] == [["doctor", "passed", "3.0"], ["fsdp", "needs 4 GPUs", ""], ["lesson 14", "FAILED", "12.0"]]


def test_report_names_the_machine_counts_the_results_and_carries_failures_and_lessons():
    lessons = {"01_data_parallel": "device_ids: [0] | main device: cuda:0", "07_ddp_spawn": "```\nloaded onto: x"}
    text = gpu_check.report(INFO, RESULTS, lessons, DAY)
    assert text.splitlines()[0] == "# make gpu-check on 1 x NVIDIA H200, 2026-11-25"
    assert "- driver: 570.1" in text and "- torch: 2.8.0" in text
    assert "1 passed, 1 failed, 1 wait for a machine with more GPUs." in text
    assert gpu_check.table(RESULTS) in text
    assert "### lesson 14\n\n````text\nAssertionError\n-> exit code 1\n````" in text
    assert nbtools.lesson_outputs(text) == lessons  # a three-backtick fence inside survives


def test_report_name_is_dated_and_names_the_gpus():
    assert gpu_check.report_name(DAY, ["NVIDIA H200"]) == "2026-11-25-1x-nvidia-h200.md"
    assert gpu_check.report_name(DAY, ["NVIDIA A100-SXM4-80GB"] * 8) == "2026-11-25-8x-nvidia-a100-sxm4-80gb.md"


def notebook(*cells: tuple[str, list]) -> dict:
    nb = nbformat.v4.new_notebook()
    for source, outputs in cells:
        cell = nbformat.v4.new_code_cell(source)
        cell.outputs = outputs
        nb.cells.append(cell)
        nb.cells.append(nbformat.v4.new_markdown_cell("prose between"))
    return nb


def test_shown_on_gpu_takes_what_the_code_cell_above_printed():
    stream = nbformat.v4.new_output("stream", name="stdout", text="[rank 0] on cuda:0\n")
    listing = nbformat.v4.new_output("display_data", data={"text/markdown": "```python\n```", "text/plain": "<Md>"})
    result = nbformat.v4.new_output("execute_result", data={"text/plain": "'nccl'"}, execution_count=2)
    nb = notebook(("first()", [nbformat.v4.new_output("stream", name="stdout", text="not this\n")]),
                  ("show_source(f)\nrun()", [listing, stream, result]),
                  ('gpu_run_output("07_ddp_spawn")', []))
    assert nbtools.shown_on_gpu(nb) == {"07_ddp_spawn": "[rank 0] on cuda:0\n'nccl'\n"}


@pytest.mark.parametrize("lesson", LESSONS_WITH_A_GPU_CELL)
def test_the_lessons_show_their_gpu_run_beside_the_cpu_one(lesson):
    nb = nbformat.read(ROOT / "notebooks" / f"{lesson}.ipynb", as_version=4)
    calls = [k for k, c in enumerate(nb.cells) if "gpu_run_output(" in c.source]
    assert len(calls) == 1 and nb.cells[calls[0] - 1].cell_type == "code"
    assert f'gpu_run_output("{lesson}")' in nb.cells[calls[0]].source
    assert "nbval-ignore-output" in nb.cells[calls[0]].metadata.get("tags", [])
    fake = {"cells": [dict(c, outputs=[nbformat.v4.new_output("stream", name="stdout", text=f"cell {k}\n")])
                      if c.cell_type == "code" else c for k, c in enumerate(nb.cells)]}
    assert nbtools.shown_on_gpu(fake) == {lesson: f"cell {calls[0] - 1}\n"}


def test_gpu_run_output_without_a_report_prints_one_stable_line(tmp_path, capsys):
    (tmp_path / "README.md").write_text("not a report")
    nbtools.gpu_run_output("01_data_parallel", folder=str(tmp_path))
    assert capsys.readouterr().out == nbtools.NO_GPU_RUN + "\n"


def test_gpu_run_output_shows_the_newest_report(tmp_path, capsys):
    old = gpu_check.report(INFO, RESULTS, {"01_data_parallel": "old run"}, datetime.date(2026, 1, 2))
    (tmp_path / "2026-01-02-1x-nvidia-h200.md").write_text(old)
    new = gpu_check.report(dict(INFO, GPUs="2 x NVIDIA L4"), RESULTS, {"01_data_parallel": "a\nb"}, DAY)
    (tmp_path / "2026-11-25-2x-nvidia-l4.md").write_text(new)
    nbtools.gpu_run_output("01_data_parallel", folder=str(tmp_path))
    nbtools.gpu_run_output("14_sharding", folder=str(tmp_path))
    assert capsys.readouterr().out.splitlines() == [
        "docs/gpu-check/2026-11-25-2x-nvidia-l4.md (make gpu-check on 2 x NVIDIA L4, 2026-11-25):", "a", "b",
        "docs/gpu-check/2026-11-25-2x-nvidia-l4.md (make gpu-check on 2 x NVIDIA L4, 2026-11-25) has no output "
        "of 14_sharding: see its table of results"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU machine main() runs every item")
def test_without_cuda_it_says_so_in_one_line_and_exits_0(capsys):
    assert gpu_check.main([]) == 0
    out = capsys.readouterr().out
    assert len(out.splitlines()) == 1 and out.startswith("gpu-check: no CUDA GPU on this machine")


def test_list_shows_every_item_with_the_gpus_it_needs(capsys):
    assert gpu_check.main(["--list", "--only", "4 GPUs"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == [f"4 GPU(s)  {i.name}" for i in ITEMS if "4 GPUs" in i.name] and len(lines) == 10


def test_main_on_a_fake_one_gpu_machine_runs_every_item_and_writes_the_report(tmp_path, monkeypatch, capsys):
    """The whole run with CUDA faked and fake items: one passes (and leaves an executed lesson),
    one fails, one needs 2 GPUs; every item runs, the report has the table and the lesson's output."""
    out = tmp_path / "out"
    lesson = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("print('on cuda:0')"),
                                             nbformat.v4.new_code_cell('gpu_run_output("01_data_parallel")')])
    lesson.cells[0].outputs = [nbformat.v4.new_output("stream", name="stdout", text="on cuda:0\n")]
    write = (f"import os, sys; os.makedirs({str(out / 'notebooks')!r}); "
             f"open({str(out / 'notebooks' / 'x.ipynb')!r}, 'w').write(sys.argv[1]); print('OK: lesson')")
    items = [Item("fails first", 1, ("{python}", "-c", "raise SystemExit(2)")),
             Item("writes a lesson", 1, ("{python}", "-c", write, nbformat.writes(lesson)), ("OK: ",)),
             Item("wants two", 2, ("{python}", "-c", "raise SystemExit(5)"))]
    monkeypatch.setattr(gpu_check, "ITEMS", items)
    monkeypatch.setattr(gpu_check, "SUITES", [])
    monkeypatch.setattr(gpu_check, "notebook_items", lambda out: [])
    monkeypatch.setattr(gpu_check, "machine", lambda names: dict(INFO, GPUs=f"{len(names)} x {names[0]}"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i: "Fake GPU")
    assert gpu_check.main(["--out", str(out)]) == 1
    printed = capsys.readouterr().out
    assert "| fails first | FAILED |" in printed and "| wants two | needs 2 GPUs |  |" in printed
    assert f"commit it as docs/gpu-check/{gpu_check.report_name(datetime.date.today(), ['Fake GPU'])}" in printed
    text = (out / "report.md").read_text()
    assert text.startswith("# make gpu-check on 1 x Fake GPU, ")
    assert "1 passed, 1 failed, 1 wait for a machine with more GPUs." in text
    assert re.search(r"^\| writes a lesson \| passed \| \d+\.\d \|$", text, re.M)
    assert "### fails first\n\n````text\n-> exit code 2\n````" in text
    assert nbtools.lesson_outputs(text) == {"01_data_parallel": "on cuda:0"}
    assert sorted(p.name for p in (out / "logs").iterdir()) == ["fails_first.log", "writes_a_lesson.log"]


def test_a_timed_out_item_fails_and_takes_the_processes_it_started_with_it(tmp_path):
    started = ("import subprocess, sys, time\n"
               "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
               "print('child', child.pid, flush=True)\n"
               "time.sleep(120)\n")
    result = gpu_check.run_item(Item("slow", 1, ("{python}", "-c", started), timeout=5), 1, tmp_path)
    assert result.status == "FAILED" and result.tail.endswith("timed out after 5 s\n-> exit code 124")
    pid = int(re.search(r"child (\d+)", (tmp_path / "slow.log").read_text()).group(1))
    for _ in range(100):  # SIGKILL is delivered at once; the zombie may wait for its reaper
        try:
            if "\nState:\tZ" in Path(f"/proc/{pid}/status").read_text():
                break
        except FileNotFoundError:
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"the item's child {pid} outlived it")
