"""ddp_tutorial.comm.start_methods (lesson 03): what a child inherits, and the two classic launchers."""

from __future__ import annotations

import multiprocessing
import subprocess
import sys

import pytest

from ddp_tutorial.comm import start_methods as sm

pytestmark = pytest.mark.timeout(120)

# Python's documentation of the start methods, written out: does the child see memory the
# parent changed after importing the module (only a copy of the parent does), and is the
# child a child of the parent (with forkserver it is the server's)?
DOCUMENTED = {"fork": {"sees the parent's change": True, "child of the parent": True},
              "spawn": {"sees the parent's change": False, "child of the parent": True},
              "forkserver": {"sees the parent's change": False, "child of the parent": False}}


def test_each_start_method_gives_the_child_what_pythons_documentation_says():
    seen = sm.what_children_see(timeout=90)
    assert seen == {m: DOCUMENTED[m] for m in sm.START_METHODS if m in multiprocessing.get_all_start_methods()}
    assert sm.MARK == "as imported"  # the parent's change is undone


@pytest.mark.slow  # make test stays under 12 minutes; make test-slow and CI run it
def test_process_and_mp_spawn_launchers_return_results_by_rank():
    assert sm.launch_with_process(world_size=2, timeout=90) == [3.0, 3.0]
    assert sm.launch_with_mp_spawn(world_size=2, timeout=90) == [3.0, 3.0]


def _defined_in_main(rank, world_size):
    return rank


def test_raw_mp_spawn_of_a_main_function_reports_cant_get_attribute(monkeypatch):
    # What a notebook does: the worker is an attribute of __main__ in the parent only.
    monkeypatch.setattr(_defined_in_main, "__module__", "__main__")
    monkeypatch.setattr(sys.modules["__main__"], "_defined_in_main", _defined_in_main, raising=False)
    with pytest.raises(RuntimeError, match="Can't get attribute '_defined_in_main'"):
        sm.raw_mp_spawn(_defined_in_main, nprocs=2, timeout=90)


@pytest.mark.slow
def test_the_command_line_prints_each_method_and_both_launchers_ok():
    # `python -m`: the workers are then attributes of __main__, which spawn re-imports as __mp_main__
    out = subprocess.run([sys.executable, "-m", "ddp_tutorial.comm.start_methods"], capture_output=True,
                         text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "launch_with_mp_spawn   -> results by rank: [3.0, 3.0]" in out.stdout
    assert out.stdout.rstrip().endswith(": OK")
    if "fork" in multiprocessing.get_all_start_methods():
        assert "fork       sees the parent's change: True   child of this process: True" in out.stdout
