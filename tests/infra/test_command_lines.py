"""The command lines' own checks, in process and fast (issue 38): ``ddp_tutorial.launch.errors`` (one line,
once per node, before any group; Ctrl-C exit 130), and the options of ``exercises check``, ``bench``,
``capstone.composed``, ``tensor_parallel.split_mlp`` and the lessons' other torchrun modules (world sizes
they cannot split over, refused from ``WORLD_SIZE``). ``test_bad_inputs.py`` runs the same as real
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
from ddp_tutorial.comm import p2p
from ddp_tutorial.context_parallel import torch_cp
from ddp_tutorial.exercises.__main__ import main as exercises_main
from ddp_tutorial.exercises.__main__ import source_problem
from ddp_tutorial.expert_parallel import dispatch, ep_dp
from ddp_tutorial.launch.errors import check_world_size, exit_on_interrupt, report, speaks_for_node
from ddp_tutorial.pipeline_parallel import model_parallel, pipeline_grid
from ddp_tutorial.tensor_parallel import device_mesh, split_mlp

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


# the lessons' other torchrun modules: a world they cannot split over, refused from WORLD_SIZE before any group


def _world_of(monkeypatch, size: int) -> None:
    _launched_as(monkeypatch, RANK="0", LOCAL_RANK="0", WORLD_SIZE=str(size), LOCAL_WORLD_SIZE=str(size))


def _no_group(monkeypatch, module) -> None:
    """A process group (or, for model_parallel, the worker that starts one) fails the test."""
    if hasattr(module, "distributed"):
        monkeypatch.setattr(module, "distributed", lambda *a, **k: pytest.fail("a process group was started"))
    monkeypatch.setattr("torch.distributed.init_process_group", lambda *a, **k: pytest.fail("init_process_group"))


WRONG_WORLDS = [  # (module, options, world size, the line it must say)
    (pipeline_grid, [], 3, "python -m ddp_tutorial.pipeline_parallel.pipeline_grid: error: a grid of 2 pipeline "
     "stages cannot cover world_size=3: the world size must be a multiple of 2 (stages x replicas); start it with "
     "torchrun --nproc-per-node=4 -m ddp_tutorial.pipeline_parallel.pipeline_grid"),
    (pipeline_grid, ["--widths", "10", "10", "10", "5"], 4, "a grid of 3 pipeline stages cannot cover "
     "world_size=4: the world size must be a multiple of 3 (stages x replicas); start it with torchrun "
     "--nproc-per-node=6"),
    (pipeline_grid, ["--global-batch", "6"], 4, "error: rows per replica (3); num_micro=3 does not split evenly "
     "into 2; choose --global-batch a multiple of 2 replica(s) x --num-micro"),
    (dispatch, [], 3, "python -m ddp_tutorial.expert_parallel.dispatch: error: 4 experts do not split evenly over "
     "3 ranks; choose --experts a multiple of torchrun's --nproc-per-node"),
    (dispatch, ["--experts", "6"], 4, "error: 6 experts do not split evenly over 4 ranks"),
    (ep_dp, [], 3, "python -m ddp_tutorial.expert_parallel.ep_dp: error: an expert-parallel size of 2 does not "
     "divide world_size=3; choose --ep a divisor of both torchrun's --nproc-per-node and the 4 experts"),
    (ep_dp, ["--ep", "3"], 6, "error: 4 experts do not split evenly over an expert-parallel size of 3"),
    (device_mesh, [], 3, "python -m ddp_tutorial.tensor_parallel.device_mesh: error: 8 units do not split evenly "
     "over 3 ranks; start it with torchrun --nproc-per-node a divisor of 8, e.g. 2 or 4"),
    (device_mesh, ["--tp-size", "4"], 2, "error: a tensor-parallel size of 4 does not divide world_size=2; "
     "choose --tp-size a divisor of torchrun's --nproc-per-node"),
    (p2p, None, 1, "python -m ddp_tutorial.comm.p2p: error: needs at least 2 ranks (a message needs a receiver), "
     "got 1; start it with torchrun --nproc-per-node=2 -m ddp_tutorial.comm.p2p"),
    (torch_cp, [], 3, "python -m ddp_tutorial.context_parallel.torch_cp: error: a sequence of 64 does not split "
     "into 2 chunks per rank over 3 ranks; start it with torchrun --nproc-per-node=2 or 4"),
]


@pytest.mark.parametrize(("module", "options", "world_size", "says"), WRONG_WORLDS,
                         ids=[f"{m.__name__.rsplit('.', 1)[1]}-{n}-{' '.join(o or [])}" for m, o, n, _ in WRONG_WORLDS])
def test_a_world_the_module_cannot_use_is_one_line_before_any_group(monkeypatch, capsys, module, options, world_size,
                                                                     says):
    _no_group(monkeypatch, module)
    _world_of(monkeypatch, world_size)
    line = _refused(capsys, lambda: module.main() if options is None else module.main(options))
    assert says in line, line
    assert capsys.readouterr().out == ""  # refused before any work: torch_cp prints its defaults only after


def test_the_other_ranks_of_a_wrong_world_exit_2_in_silence(monkeypatch, capsys):
    # Local rank 1 finds the same fault; local rank 0 says it (torchrun ends the job at the first exit).
    monkeypatch.setattr("ddp_tutorial.launch.errors.time.sleep", lambda seconds: None)
    for module in (pipeline_grid, dispatch, ep_dp, device_mesh, torch_cp):
        _no_group(monkeypatch, module)
        _launched_as(monkeypatch, RANK="1", LOCAL_RANK="1", WORLD_SIZE="3", LOCAL_WORLD_SIZE="3")
        with pytest.raises(SystemExit) as exit_:
            module.main([])
        assert exit_.value.code == 2, module.__name__
        assert capsys.readouterr() == ("", ""), module.__name__


@pytest.mark.parametrize(("module", "option", "value", "says"), [
    (model_parallel, "--num-steps", "0", "--num-steps must be at least 1, got 0"),
    (model_parallel, "--batch-size", "0", "--batch-size must be at least 1, got 0"),
    (model_parallel, "--lr", "nan", "--lr must be a finite number of at least 0, got nan"),
    (pipeline_grid, "--num-micro", "0", "--num-micro must be at least 1, got 0"),
    (pipeline_grid, "--global-batch", "-8", "--global-batch must be at least 1, got -8"),
    (pipeline_grid, "--widths", "10", "--widths needs at least 2 widths (an input and an output), got 1"),
    (pipeline_grid, "--lr", "inf", "--lr must be a finite number of at least 0, got inf"),
    (dispatch, "--experts", "0", "--experts must be at least 1, got 0"),
    (dispatch, "--top-k", "5", "--top-k 5 chooses more experts than there are (--experts 4)"),
    (dispatch, "--capacity-factor", "0", "--capacity-factor must be a positive finite number, got 0.0"),
    (ep_dp, "--ep", "0", "--ep must be at least 1, got 0"),
    (ep_dp, "--steps", "0", "--steps must be at least 1, got 0"),
    (device_mesh, "--tp-size", "0", "--tp-size must be at least 1, got 0"),
    (device_mesh, "--num-steps", "-1", "--num-steps must be at least 1, got -1"),
    (torch_cp, "--seq", "8", "unrecognized arguments: --seq 8"),
], ids=lambda value: value.__name__.rsplit(".", 1)[1] if hasattr(value, "__name__") else None)
def test_a_bad_option_of_a_lesson_module_is_one_line(monkeypatch, capsys, module, option, value, says):
    _no_group(monkeypatch, module)
    monkeypatch.setattr(model_parallel, "ddp_mp_worker", lambda *a, **k: pytest.fail("the worker ran"))
    _launched_as(monkeypatch)
    line = _refused(capsys, lambda: module.main([option, value]))
    assert line == f"{module.PROG}: error: {says}", line


def test_model_parallel_refuses_a_broken_launcher_environment_in_one_line(monkeypatch, capsys):
    # Any world size fits (without two GPUs per rank, both halves run on the CPU); the environment is still checked.
    monkeypatch.setattr(model_parallel, "ddp_mp_worker", lambda *a, **k: pytest.fail("the worker ran"))
    _launched_as(monkeypatch, RANK="5", LOCAL_RANK="0", WORLD_SIZE="2", LOCAL_WORLD_SIZE="2")
    assert _refused(capsys, lambda: model_parallel.main([])) == (
        "python -m ddp_tutorial.pipeline_parallel.model_parallel: error: RANK=5 is not in range for WORLD_SIZE=2")


@pytest.mark.parametrize("module", [model_parallel, pipeline_grid, dispatch, ep_dp, device_mesh, p2p, torch_cp],
                         ids=lambda module: module.__name__.rsplit(".", 1)[1])
def test_ctrl_c_in_a_lesson_module_is_one_line_and_130(monkeypatch, capsys, module):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    # A world that fits each (p2p and pipeline_grid's two stages need two ranks), and Ctrl-C where the ranks meet.
    _world_of(monkeypatch, 2 if module in (p2p, pipeline_grid) else 1)
    if module is model_parallel:
        monkeypatch.setattr(module, "ddp_mp_worker", interrupted)
    else:
        monkeypatch.setattr(module, "distributed", interrupted)
    argv = None if module is p2p else []  # p2p takes no options
    with pytest.raises(SystemExit) as exit_:
        module.main() if argv is None else module.main(argv)
    assert exit_.value.code == 130 and exit_.value.__cause__ is None
    assert capsys.readouterr().err == f"{module.PROG}: interrupted: nothing was saved; run it again\n"
