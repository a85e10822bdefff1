"""What a check leaves behind and where the learner's code runs: no process left running, a scratch
working folder, and a stuck rank named by its line.

Each check here fails at its first case on a world of 1, so it starts one rank once.

Covers ``ddp_tutorial.exercises.checker`` (``stopped_note``, ``hang``), ``ddp_tutorial.exercises.harness``
(``in_scratch``, ``stuck_at``) with ``ddp_tutorial.launch``'s ``leftovers``.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from ddp_tutorial.exercises import EXERCISES, run_check
from ddp_tutorial.exercises.checker import hang
from ddp_tutorial.exercises.harness import stuck_at
from ddp_tutorial.launch import WorkerTimeout
from ddp_tutorial.pitfalls.strays import alive  # a process that exists and is not a zombie

ROOT = Path(__file__).resolve().parents[2]
NAME = "ring_shift"  # world sizes 1, 2, 3: a failure on a world of 1 ends the check after one launch
linux_only = pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="Linux: reads /proc")


def learner(tmp_path: Path, text: str, name: str = "mine.py") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text).lstrip())
    return path


@linux_only
def test_a_child_in_a_session_of_its_own_is_stopped_and_the_verdict_says_so(tmp_path):
    pid_file = tmp_path / "child.pid"
    source = learner(tmp_path, f"""
        import os
        import subprocess
        import time


        def ring_shift(tensor, hops=1):
            subprocess.Popen(["sh", "-c", 'echo $$ > "{pid_file}.tmp" && mv "{pid_file}.tmp" "{pid_file}" && exec sleep 600'],
                             start_new_session=True)
            while not os.path.exists("{pid_file}"):
                time.sleep(0.01)
            raise ValueError("not written yet")
        """)
    result = run_check(NAME, file=source, timeout=60)
    pid = int(pid_file.read_text())
    assert not alive(pid), "the learner's child outlived the check"
    assert not result.passed
    assert "raised ValueError: not written yet at line 11 (raise ValueError(\"not written yet\"))" in result.message, result.message
    assert (f"the check stopped 1 process your code left running (pid {pid}" in result.message
            and "started by rank 0 of a world of 1): wait for what you start, or stop it" in result.message), \
        result.message


def test_a_relative_path_lands_in_a_scratch_folder_not_in_the_working_directory(tmp_path, monkeypatch):
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)  # where the learner runs the check from
    record = tmp_path / "where.txt"
    source = learner(tmp_path, f"""
        import os


        def ring_shift(tensor, hops=1):
            with open("notes.txt", "w") as f:
                f.write("a rank's notes")
            with open({str(record)!r}, "w") as f:
                f.write(os.path.abspath("notes.txt"))
            raise ValueError("stop here")
        """)
    result = run_check(NAME, file=source, timeout=60)
    assert "raised ValueError: stop here" in result.message, result.message
    written = Path(record.read_text())
    assert written.name == "notes.txt" and written.parent.name.startswith("ddp_tutorial_scratch_"), written
    assert not (here / "notes.txt").exists() and not (ROOT / "notes.txt").exists()
    assert ROOT not in written.parents and here not in written.parents
    assert not written.parent.exists(), "the scratch folder outlived the check"


@pytest.mark.parametrize("text, lines", [
    # a busy loop: stopped on the loop's test or on its body, whichever instruction ran then
    ("def ring_shift(tensor, hops=1):\n    while True:\n        pass\n", ["2 `while True:`", "3 `pass`"]),
    # a hang while the file is imported
    ("import time\n\ntime.sleep(600)\n\n\ndef ring_shift(tensor, hops=1):\n    return tensor\n",
     ["3 `time.sleep(600)`"]),
], ids=["busy_loop", "hang_at_import"])
def test_a_rank_stuck_in_its_own_code_is_named_by_its_line(tmp_path, text, lines):
    source = learner(tmp_path, text, "stuck.py")
    result = run_check(NAME, file=source, timeout=3)
    assert not result.passed
    assert "rank 0 is still running after 3 s in a world of 1" in result.message, result.message
    assert any(f"rank 0 was stuck at stuck.py:{line}" in result.message for line in lines), result.message
    assert "not waiting for another rank: a loop that never ends, or a call that blocks" in result.message
    assert EXERCISES[NAME].hang_hint not in result.message  # the deadlock hint would mislead here


FRAME = '  File "{file}", line {line} in {fn}\n'


def dump(*threads: list[tuple[str, int, str]]) -> str:
    """A faulthandler dump: one block per thread, innermost frame first."""
    return "\n".join("Thread 0x00007f (most recent call first):\n"
                     + "".join(FRAME.format(file=f, line=n, fn=fn) for f, n, fn in frames) for frames in threads)


def test_stuck_at_reads_the_learner_s_innermost_line_and_whether_it_was_its_own(tmp_path):
    source = str(tmp_path / "mine.py")
    c10d = "/venv/torch/distributed/distributed_c10d.py"
    checker_frames = [("/pkg/ddp_tutorial/exercises/harness.py", 120, "run_cases")]
    (tmp_path / "rank0.stack").write_text(dump([("/usr/lib/threading.py", 324, "wait")],
                                               [(source, 7, "helper"), (source, 3, "ring_shift"), *checker_frames]))
    (tmp_path / "rank1.stack").write_text(dump([(c10d, 2100, "all_reduce"), (source, 9, "ring_shift"),
                                                *checker_frames]))
    (tmp_path / "rank2.stack").write_text(dump(checker_frames))
    assert stuck_at(str(tmp_path), 0, source) == (7, True)  # its own line: a loop, a sleep
    assert stuck_at(str(tmp_path), 1, source) == (9, False)  # inside a collective it called there
    assert stuck_at(str(tmp_path), 2, source) is None  # not in the learner's file
    assert stuck_at(str(tmp_path), 3, source) is None  # no dump at all


def test_a_hang_names_the_call_and_the_line_and_keeps_the_exercise_s_hint(tmp_path):
    source = tmp_path / "mine.py"
    source.write_text("import torch.distributed as dist\n\n\ndef ring_shift(tensor, hops=1):\n"
                      "    dist.send(tensor, dst=1)\n    return tensor\n")
    for rank in (0, 1):
        (tmp_path / f"rank{rank}.log").write_text(f"case 1 hop(s)\n> send to rank {1 - rank} (#1)\n")
        (tmp_path / f"rank{rank}.stack").write_text(dump([("/venv/torch/distributed/distributed_c10d.py", 2000,
                                                           "send"), (str(source), 5, "ring_shift")]))
    message = hang(EXERCISES[NAME], WorkerTimeout([0, 1], 8), 2, 8, str(tmp_path), source)
    assert message.startswith("ranks 0, 1 are still running after 8 s in a world of 2, case 1 hop(s) "
                              "(rank 0 is stuck in send to rank 1 (#1) at mine.py:5; "
                              "rank 1 is stuck in send to rank 0 (#1) at mine.py:5): "), message
    assert message.endswith(EXERCISES[NAME].hang_hint + "."), message
