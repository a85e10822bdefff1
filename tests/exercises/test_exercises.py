"""ddp_tutorial.exercises: every solution passes, every stub fails fast (typical mistakes: test_mistakes_*.py).

Each check starts 1, 2 and 3 ranks (or the world sizes its exercise names) on tiny tensors; a deadlock case waits 8 s. Learner
copies go to a temporary folder (``DDP_TUTORIAL_EXERCISES_DIR``), never into the checkout.

Covers ``ddp_tutorial.exercises.exercise``, ``ddp_tutorial.exercises.registry``,
``ddp_tutorial.exercises.checker``, ``ddp_tutorial.exercises.harness``,
``ddp_tutorial.exercises.tracing``, ``ddp_tutorial.exercises.recording``, ``ddp_tutorial.exercises.stubgen``,
``ddp_tutorial.exercises.workspace``, ``ddp_tutorial.exercises.checks.*`` (every lesson's checks).
"""

from __future__ import annotations

import inspect
import subprocess
import sys
from pathlib import Path

import pytest
from wrong_answers import MISTAKES  # tests/exercises/wrong_answers.py, beside this file

from ddp_tutorial.exercises import EXERCISES, checker, learner_file, reset, run_check, show, workspace
from ddp_tutorial.exercises.__main__ import main
from ddp_tutorial.exercises.harness import load_function
from ddp_tutorial.exercises.stubgen import stale_stubs

ROOT = Path(__file__).resolve().parents[2]
NAMES = list(EXERCISES)


@pytest.fixture
def learner_dir(tmp_path, monkeypatch) -> Path:
    """A learner folder of this test's own; not the checkout's my_exercises/."""
    folder = tmp_path / "mine"
    monkeypatch.setenv(workspace.FOLDER_ENV, str(folder))
    monkeypatch.delenv(workspace.FRESH_ENV, raising=False)
    return folder


@pytest.mark.parametrize("name", NAMES)
def test_the_solution_passes(name):
    result = run_check(name, solution=True)
    assert result.passed, result.message
    assert f"exercise {EXERCISES[name].number} ({name})" in result.message
    assert f"right on world sizes {', '.join(map(str, EXERCISES[name].world_sizes))}" in result.message


@pytest.mark.parametrize("name", NAMES)
def test_an_untouched_stub_fails_fast_with_the_not_implemented_message(name, learner_dir, monkeypatch):
    def no_rank(*args, **kwargs):
        raise AssertionError("a rank was started for an untouched stub")

    monkeypatch.setattr(checker, "spawn", no_rank)  # fast because no rank is started: the stub is read, not run
    result = run_check(name)
    assert not result.passed
    assert result.message == EXERCISES[name].not_implemented(workspace.shown(learner_dir / f"{name}.py"))
    # a fresh stub is the expected start, not a failure: the verdict and the message say so, and what next
    assert str(result).startswith("TO DO ") and not str(result).startswith("FAIL")
    assert result.message.startswith(f"exercise {EXERCISES[name].number} ({name}): not started yet, as expected "
                                     "for a fresh stub: ")
    assert f"Next: write {name}() there" in result.message and "then check again" in result.message
    # called, the stub raises the message it was generated with (the default learner folder's)
    stub = load_function(str(workspace.stub_file(name)), name)
    with pytest.raises(NotImplementedError) as raised:
        parameters = inspect.signature(stub).parameters.values()  # keyword-only ones (21.2's) by name
        stub(*[None for p in parameters if p.kind is p.POSITIONAL_OR_KEYWORD],
             **{p.name: None for p in parameters if p.kind is p.KEYWORD_ONLY})
    assert str(raised.value) == EXERCISES[name].not_implemented()
    assert f"my_exercises/{name}.py" in str(raised.value) and EXERCISES[name].notebook in str(raised.value)


def test_a_stub_with_code_above_its_raise_is_still_not_implemented(learner_dir):
    path = Path(learner_file("scatter_p2p"))
    code = "    rank = dist.get_rank()\n    # Your code here"
    path.write_text(path.read_text().replace("    # Your code here", code))
    result = run_check("scatter_p2p")
    assert not result.passed
    assert result.started and str(result).startswith("FAIL ")  # started: a real failure now
    assert "still raises NotImplementedError" in result.message and "delete that line" in result.message


def test_every_hard_exercise_has_two_mistakes_or_more():
    hard = [name for name, e in EXERCISES.items() if e.level == "hard"]
    assert hard
    for name in hard:
        assert sum(m[0] == name for m in MISTAKES.values()) >= 2, name


def test_every_medium_exercise_from_lesson_07_on_has_two_mistakes_or_more():
    for name, e in EXERCISES.items():
        if e.level == "medium" and e.lesson >= 7:
            assert sum(m[0] == name for m in MISTAKES.values()) >= 2, name


def test_every_lesson_from_02_on_has_an_exercise_and_15_in_all():
    # every lesson from 02 on has one, except 16 (the cluster: its scripts are tested on Slurm)
    lessons = {int(p.name[:2]) for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")}
    assert {e.lesson for e in EXERCISES.values()} == {n for n in lessons if n >= 2} - {16}
    assert len(EXERCISES) >= 15
    for e in EXERCISES.values():  # numbered by lesson: 2.1, 2.2, ..., 22.1
        assert e.number.split(".")[0] == str(e.lesson), e.name
    assert (EXERCISES["group_sums"].number, EXERCISES["group_sums"].world_sizes) == ("2.2", (1, 2, 3, 4))


def test_an_edit_counts_without_a_restart(learner_dir):
    path = Path(learner_file("all_gather_p2p"))
    assert not run_check("all_gather_p2p").passed
    path.write_text(workspace.solution_file("all_gather_p2p").read_text())
    assert run_check("all_gather_p2p").passed


def test_the_committed_stubs_are_what_the_generator_makes():
    assert stale_stubs() == [], "run: python -m ddp_tutorial.exercises.stubgen"


def test_every_exercise_names_a_lesson_that_exists():
    for name, e in EXERCISES.items():
        assert (ROOT / "notebooks" / e.notebook).is_file(), name
        assert workspace.solution_file(name).is_file() and workspace.stub_file(name).is_file(), name
        assert e.signature().startswith(f"{name}(")


def test_the_learner_folder_is_in_the_checkout_and_ignored_by_git(monkeypatch):
    monkeypatch.delenv(workspace.FOLDER_ENV, raising=False)
    assert workspace.folder() == ROOT / "my_exercises"
    assert workspace.shown(workspace.learner_path("ring_all_reduce")) == "my_exercises/ring_all_reduce.py"
    ignored = subprocess.run(["git", "check-ignore", "-q", "my_exercises/ring_all_reduce.py"], cwd=ROOT)
    assert ignored.returncode == 0, "my_exercises/ is not in .gitignore"


def test_seeding_keeps_work_and_reset_restores_the_stub(learner_dir, capsys):
    mine = Path(learner_file("ring_shift"))
    assert sorted(p.name for p in learner_dir.glob("*.py")) == sorted(f"{n}.py" for n in NAMES)
    mine.write_text("# my work\n")
    learner_file("ring_all_reduce")  # seeding again must not overwrite
    assert mine.read_text() == "# my work\n"
    reset("ring_shift")
    assert mine.read_text() == workspace.stub_file("ring_shift").read_text()
    assert "ring_shift.py is the stub again" in capsys.readouterr().out


def test_fresh_mode_checks_the_stub_and_writes_nothing(learner_dir, monkeypatch):
    monkeypatch.setenv(workspace.FRESH_ENV, "1")
    result = run_check("ring_shift")
    assert "not started yet" in result.message
    assert not learner_dir.exists()


def test_show_prints_the_card(learner_dir, capsys):
    show("ring_all_reduce")
    out = capsys.readouterr().out
    assert "Exercise 6.1 (hard), lesson 06_ring_all_reduce.ipynb" in out
    assert "ring_all_reduce(tensor: torch.Tensor) -> torch.Tensor" in out and "hint 1/3:" in out


# What the stubs' docstrings used to spell out, now in the last hints only
HOW = {"ring_all_reduce": ["(rank - t - 1) % n", "(rank + 1 - t) % n"],
       "bucketed_grad_hooks": ["p.grad / world_size", "async_op=True"],
       "zero1_step": ["(1 - b1 ** step)", "sqrt(v"],
       "ring_attention_forward": ["logaddexp(lse, lse_b)", "exp(lse_b - new)"]}


@pytest.mark.parametrize("name", HOW)
def test_a_hard_exercise_has_three_graduated_hints_and_a_docstring_that_is_a_contract(name, learner_dir, capsys):
    e = EXERCISES[name]
    assert len(e.hints) == 3
    show(name)
    card = capsys.readouterr().out
    assert "hint 1/3:" in card and f"show({name!r}, hint=2)" in card and e.hints[1][:40] not in card
    for level in (1, 2, 3):
        show(name, hint=level)
        out = capsys.readouterr().out
        assert f"hint {level}/3:" in out and " ".join(e.hints[level - 1].split()[:6]) in " ".join(out.split())
        assert (f"hint={level + 1}" in out) == (level < 3)
    with pytest.raises(ValueError, match="not 4"):
        show(name, hint=4)
    # the stub keeps the contract (what holds after the call) and points to the hints, not to the formulas
    stub = workspace.stub_file(name).read_text()
    assert f'show("{name}", hint=1)' in stub
    for formula in HOW[name]:
        assert formula not in stub, formula
        assert any(formula in hint for hint in e.hints), formula  # moved, not lost


def test_cli_exit_codes(learner_dir, tmp_path, capsys):
    assert main(["list"]) == 0
    assert "ring_all_reduce" in capsys.readouterr().out
    assert main(["check", "scatter_p2p", "--solution"]) == 0
    assert main(["check", "scatter_p2p"]) == 1
    assert "TO DO exercise 5.1 (scatter_p2p): not started yet" in capsys.readouterr().out
    assert main(["show", "ring_all_reduce", "--hint", "3"]) == 0
    assert "hint 3/3:" in capsys.readouterr().out
    assert main(["show", "ring_all_reduce", "--hint", "4"]) == 2
    assert "has hints 1 to 3, not 4" in capsys.readouterr().err
    assert main(["check", "scatter_p2p", "--file", str(workspace.solution_file("scatter_p2p"))]) == 0
    assert main(["check", "no_such_exercise"]) == 2
    assert main(["check", "scatter_p2p", "--file", str(tmp_path / "missing.py")]) == 2
    assert main(["reset", "scatter_p2p"]) == 0
    for argv in ([], ["check"], ["check", "scatter_p2p", "--solution", "--file", "x.py"]):
        with pytest.raises(SystemExit) as usage:
            main(argv)
        assert usage.value.code == 2


@pytest.mark.slow  # make test stays under 12 minutes; make test-slow and CI run it
def test_python_dash_m_lists_the_exercises():
    out = subprocess.run([sys.executable, "-m", "ddp_tutorial.exercises", "list"], capture_output=True, text=True,
                         cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert all(name in out.stdout for name in NAMES)


def test_imported_module_finds_every_spelling_of_an_import():
    from ddp_tutorial.exercises.harness import imported_module
    refused = ("ddp_tutorial.comm.ring",)
    assert imported_module("import ddp_tutorial.comm.ring as r\n", refused) == "ddp_tutorial.comm.ring"
    assert imported_module("from ddp_tutorial.comm import ring\n", refused) == "ddp_tutorial.comm.ring"
    assert imported_module("def f():\n    from ddp_tutorial.comm.ring import segment_bounds\n", refused) == "ddp_tutorial.comm.ring"
    assert imported_module("import ddp_tutorial.ringside\nfrom ddp_tutorial.comm import p2p\n", refused) is None
    assert imported_module("from . import ring\n", refused) is None  # relative: not the course's package


def test_a_rank_log_says_where_a_rank_is_stuck_and_what_it_called_last(tmp_path):
    from ddp_tutorial.exercises.tracing import last_call, where_stuck
    (tmp_path / "rank1.log").write_text("case numel 6\n> irecv from rank 0 (#2)\n< irecv from rank 0 (#2)\n")
    assert where_stuck(str(tmp_path), 1) == ("numel 6", "")  # it returned: not blocked in it
    assert last_call(str(tmp_path), 1) == "irecv from rank 0 (#2)"  # but that is where gloo aborted it
    (tmp_path / "rank1.log").write_text("case numel 6\n> wait for isend to rank 0 (#1)\n")
    assert where_stuck(str(tmp_path), 1) == ("numel 6", "stuck in wait for isend to rank 0 (#1)")
    assert last_call(str(tmp_path), 1) == "isend to rank 0 (#1)"
    (tmp_path / "rank1.log").write_text("case numel 6\n> irecv from rank 0 (#2)\ncase numel 7\n")
    assert last_call(str(tmp_path), 1) == ""  # a new case: nothing called in it yet
    assert last_call(str(tmp_path), 3) == ""  # no log at all


def test_recording_tells_the_learners_calls_from_the_librarys_own(tmp_path, monkeypatch):
    import types

    import torch

    from ddp_tutorial.exercises.recording import learner_calls, recording
    from ddp_tutorial.exercises.tracing import Trace
    torch.save({"w": torch.ones(2)}, tmp_path / "w.pt")
    library = types.ModuleType("library_for_this_test")
    library.read = lambda path: torch.load(path, weights_only=True)  # as dcp.load torch.loads its own files
    monkeypatch.setitem(sys.modules, library.__name__, library)
    load, trace = torch.load, Trace(0, str(tmp_path))
    with recording(trace, {"torch.load": ["torch:load"], "read": [f"{library.__name__}:read"]}) as calls:
        torch.load(tmp_path / "w.pt", weights_only=False)
        library.read(tmp_path / "w.pt")
    trace.close()
    assert torch.load is load and library.read.__name__ == "<lambda>"  # restored
    assert [(c.name, c.nested) for c in calls] == [("torch.load", False), ("read", False), ("torch.load", True)]
    assert [c.arguments.get("weights_only") for c in learner_calls(calls, "torch.load")] == [False]
    log = (tmp_path / "rank0.log").read_text().splitlines()
    assert log[:2] == ["> torch.load (call 1)", "< torch.load (call 1)"] and "> read (call 2)" in log


def test_the_readme_names_every_hard_exercise():
    hard = [e.number for e in EXERCISES.values() if e.level == "hard"]
    assert all(len(EXERCISES[name].hints) == 3 for name in EXERCISES if EXERCISES[name].level == "hard")
    assert f"The hard exercises ({', '.join(hard)}) have three hints" in (ROOT / "README.md").read_text()
