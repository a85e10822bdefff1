"""The command lines' own checks, in process and fast (issue 38): ``ddp_tutorial.launch.errors`` (one line,
once per node, before any group; Ctrl-C exit 130), and the options of ``exercises check``, ``bench``,
``capstone.composed`` and ``tensor_parallel.split_mlp``. ``test_bad_inputs.py`` runs the same as real
processes (slow).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ddp_tutorial.bench.__main__ import build_parser as bench_parser
from ddp_tutorial.bench.common import checked, output_problem
from ddp_tutorial.capstone import composed
from ddp_tutorial.exercises.__main__ import main as exercises_main
from ddp_tutorial.exercises.__main__ import source_problem
from ddp_tutorial.launch.errors import check_world_size, exit_on_interrupt, report, speaks_for_node
from ddp_tutorial.tensor_parallel import split_mlp

ROOT = Path(__file__).resolve().parents[2]
TORCHRUN_RANK_1 = {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}


def _launched_as(monkeypatch, **env: str) -> None:
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)


def _refused(capsys, call) -> str:
    """``call()`` must exit 2 with one line on stderr; that line."""
    with pytest.raises(SystemExit) as exit_:
        call()
    assert exit_.value.code == 2
    said = capsys.readouterr().err.strip().splitlines()
    assert len(said) == 1, said
    return said[0]


def test_local_rank_0_speaks_for_its_node_and_the_others_stay_silent(monkeypatch, capsys):
    _launched_as(monkeypatch)
    assert speaks_for_node()  # no launcher: the one process speaks
    _launched_as(monkeypatch, RANK="3", LOCAL_RANK="0", WORLD_SIZE="4", LOCAL_WORLD_SIZE="2")
    assert speaks_for_node()  # another node's local rank 0
    _launched_as(monkeypatch, LOCAL_RANK="x")
    assert speaks_for_node()  # a broken environment: every rank says why
    _launched_as(monkeypatch, **TORCHRUN_RANK_1)
    monkeypatch.setattr("ddp_tutorial.launch.errors.time.sleep", lambda seconds: None)
    report("said once")
    assert not speaks_for_node() and capsys.readouterr().err == ""


def test_world_size_checked_from_the_environment_before_any_group(monkeypatch, capsys):
    _launched_as(monkeypatch, RANK="0", LOCAL_RANK="0", WORLD_SIZE="3", LOCAL_WORLD_SIZE="3")
    seen = []
    assert check_world_size("prog", lambda n: seen.append(n) or "fine") == "fine" and seen == [3]

    def uneven(n: int) -> None:
        raise ValueError(f"8 units do not split evenly over {n} ranks")

    line = _refused(capsys, lambda: check_world_size("prog", uneven, advice="use 4 or 8"))
    assert line == "prog: error: 8 units do not split evenly over 3 ranks; use 4 or 8"
    _launched_as(monkeypatch, RANK="5", LOCAL_RANK="0", WORLD_SIZE="2")
    assert "RANK=5 is not in range for WORLD_SIZE=2" in _refused(capsys, lambda: check_world_size("prog", uneven))


def test_ctrl_c_inside_exit_on_interrupt_is_one_line_and_130(monkeypatch, capsys):
    _launched_as(monkeypatch)
    with pytest.raises(SystemExit) as exit_:
        with exit_on_interrupt("prog", "nothing was saved"):
            raise KeyboardInterrupt
    assert exit_.value.code == 130 and exit_.value.__cause__ is None
    assert capsys.readouterr().err == "prog: interrupted: nothing was saved\n"


# exercises check


def test_check_refuses_a_timeout_that_is_not_a_positive_number(capsys):
    for bad, shown in (("0", "0"), ("nan", "nan"), ("-5", "-5"), ("inf", "inf")):
        line = _refused(capsys, lambda: exercises_main(["check", "scatter_p2p", "--timeout", bad]))
        assert line == ("python -m ddp_tutorial.exercises check: error: --timeout must be a positive number of "
                        f"seconds, got {shown}")


def test_a_source_file_that_cannot_be_read_as_utf8_is_named(tmp_path, capsys):
    latin = tmp_path / "mine.py"
    latin.write_bytes('x = "café"\n'.encode("latin-1"))
    assert source_problem(str(latin)) == (f"{latin} is not UTF-8 text (byte 0xe9 at position 8): "
                                          "save it as UTF-8, as Python expects")
    assert source_problem(str(tmp_path)) == f"{tmp_path} is a folder; give the Python file that defines the " \
                                            "exercise's function"
    assert source_problem(str(tmp_path / "none.py")) == f"no file {tmp_path / 'none.py'}"
    latin.write_text('x = "café"\n', encoding="utf-8")
    assert source_problem(str(latin)) is None
    latin.write_bytes(b"\xff\xfe")
    assert exercises_main(["check", "scatter_p2p", "--file", str(latin)]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"error: {latin} is not UTF-8 text (byte 0xff at position "
                                                            "0): save it as UTF-8, as Python expects"]


# bench


def test_every_number_of_every_benchmark_is_checked_as_it_is_parsed(capsys):
    parser, commands = bench_parser()
    numeric = [(name, action) for name, sub in commands.items() for action in sub._actions
               if getattr(action.type, "__name__", "") in ("int", "float")]
    assert len(numeric) > 40  # every subcommand's counts and amounts
    for name, action in numeric:
        assert action.type not in (int, float), (name, action.option_strings)  # checked, not argparse's own
        option = action.option_strings[0]
        line = _refused(capsys, lambda: parser.parse_args([name, option, "0"]))
        assert line.startswith(f"python -m ddp_tutorial.bench {name}: error: argument {option}: must be"), line


def test_checked_numbers():
    count, amount = checked(int), checked(float)
    assert count("3") == 3 and amount("0.5") == 0.5
    for convert, text, why in ((count, "0", "must be at least 1, got 0"), (count, "-2", "must be at least 1, got -2"),
                               (count, "two", "invalid int value: 'two'"), (amount, "nan", "got nan"),
                               (amount, "inf", "got inf"), (amount, "0", "got 0"), (amount, "x", "invalid float")):
        with pytest.raises(argparse.ArgumentTypeError, match=why):
            convert(text)


def test_an_output_path_that_cannot_be_written_is_refused_without_writing(tmp_path):
    assert output_problem(str(tmp_path)) == "it is a folder; give a file path"
    assert output_problem(str(tmp_path / "no" / "r.json")) == f"the folder {tmp_path / 'no'} does not exist; " \
                                                             "create it first"
    assert output_problem("/dev/null/x") == "/dev/null is not a folder"
    assert output_problem(str(tmp_path / "new.json")) is None and not (tmp_path / "new.json").exists()
    kept = tmp_path / "old.json"
    kept.write_text("earlier results\n")
    assert output_problem(str(kept)) is None and kept.read_text() == "earlier results\n"
    if os.geteuid() != 0:  # root writes whatever the mode bits say
        (tmp_path / "locked").mkdir(mode=0o555)
        assert output_problem(str(tmp_path / "locked" / "r.json")) == ("Permission denied; choose a path you can "
                                                                       "write to")


def test_bench_refuses_an_unwritable_output_before_any_benchmark(monkeypatch, capsys):
    from ddp_tutorial.bench import __main__ as bench_main
    from ddp_tutorial.bench import launch

    monkeypatch.setattr(launch, "run", lambda args: pytest.fail("the benchmark ran"))
    line = _refused(capsys, lambda: bench_main.main(["launch", "--json", "/dev/null/x"]))
    assert line == ("python -m ddp_tutorial.bench launch: error: --json /dev/null/x: cannot write it: "
                    "/dev/null is not a folder")


# capstone.composed and tensor_parallel.split_mlp


def test_composed_help_needs_no_torch():
    # As python -m runs it: --help answers before torch is imported (a bad option imports it, to say its
    # line once per node: launch.errors).
    code = ("import runpy, sys\nsys.argv = ['composed', '--help']\ntry:\n"
            "    runpy.run_module('ddp_tutorial.capstone.composed', run_name='__main__')\n"
            "except SystemExit as e:\n    print('exit', e.code, 'torch' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert done.stdout.startswith("usage: python -m ddp_tutorial.capstone.composed [-h]"), done.stdout + done.stderr
    assert done.stdout.strip().splitlines()[-1] == "exit 0 False", done.stdout + done.stderr


def test_composed_help_names_the_command_and_its_true_defaults():
    parser = composed.build_parser()
    assert parser.format_help().startswith("usage: python -m ddp_tutorial.capstone.composed [-h]")
    helps = {action.dest: action.help for action in parser._actions}
    assert helps["dp"] == "data-parallel ranks (default: the world size / (tp x pp x cp))"
    assert [helps[d] for d in ("tp", "pp", "cp")] == [f"{what}-parallel ranks (default 1)"
                                                     for what in ("tensor", "pipeline", "context")]
    defaults = parser.parse_args([])  # what the help says is what a run gets
    assert (defaults.dp, defaults.tp, defaults.pp, defaults.cp, defaults.steps) == (None, 1, 1, 1, 3)


def test_composed_refuses_sizes_below_one_and_a_layout_the_world_does_not_admit(monkeypatch, capsys):
    _launched_as(monkeypatch)
    for option in ("--dp", "--tp", "--pp", "--cp", "--steps"):
        line = _refused(capsys, lambda: composed.main([option, "0"]))
        assert line == f"python -m ddp_tutorial.capstone.composed: error: {option} must be at least 1, got 0"
    monkeypatch.setattr(composed, "distributed", lambda: pytest.fail("a process group was started"))
    _launched_as(monkeypatch, RANK="0", LOCAL_RANK="0", WORLD_SIZE="4", LOCAL_WORLD_SIZE="4")
    line = _refused(capsys, lambda: composed.main(["--tp", "3"]))
    assert "layout tp3: dp x tp x pp x cp = 3, but the world has 4 ranks" in line
    assert "tp=3 does not divide the 4 attention heads" in line and "layout --list" in line
    # dp fills the world from WORLD_SIZE: 4 ranks / tp 2 = dp 2, an admitted layout, so training would start
    monkeypatch.setattr(composed, "distributed", lambda: (_ for _ in ()).throw(RuntimeError("group started")))
    with pytest.raises(RuntimeError, match="group started"):
        composed.main(["--tp", "2"])


def test_split_mlp_refuses_an_uneven_split_from_world_size_before_any_group(monkeypatch, capsys):
    monkeypatch.setattr(split_mlp, "distributed", lambda: pytest.fail("a process group was started"))
    _launched_as(monkeypatch, RANK="0", LOCAL_RANK="0", WORLD_SIZE="3", LOCAL_WORLD_SIZE="3")
    assert _refused(capsys, lambda: split_mlp.main([])) == (
        "python -m ddp_tutorial.tensor_parallel.split_mlp: error: 8 units do not split evenly over 3 ranks; "
        "choose --hidden a multiple of torchrun's --nproc-per-node")
    for option in ("--hidden", "--batch-size"):
        line = _refused(capsys, lambda: split_mlp.main([option, "0"]))
        assert line.endswith(f"error: {option} must be at least 1, got 0")
