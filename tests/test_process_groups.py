"""ddp_tutorial.process_groups (lesson 02): init methods, launchers, sub-groups, barrier, timeouts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ddp_tutorial import process_groups as pg
from ddp_tutorial.launch import WorkerError, spawn

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("method", pg.INIT_METHODS)
@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_every_init_method_forms_a_working_group(method, world_size, tmp_path):
    results = spawn(pg.join_with, world_size, args=(method, str(tmp_path / "store")),
                    init_process_group=False, timeout=60)
    assert [r["rank"] for r in results] == list(range(world_size))
    assert {r["world_size"] for r in results} == {world_size}
    assert {r["init_method"] for r in results} == {method}
    assert [r["sum"] for r in results] == [sum(range(1, world_size + 1))] * world_size


def test_init_url_forms_and_errors(tmp_path, monkeypatch):
    monkeypatch.setenv("MASTER_ADDR", "10.1.2.3")
    monkeypatch.setenv("MASTER_PORT", "4567")
    assert pg.init_url("env") == "env://"
    assert pg.init_url("tcp") == "tcp://10.1.2.3:4567"
    monkeypatch.chdir(tmp_path)
    assert pg.init_url("file", "store") == "file://" + str(tmp_path / "store")  # made absolute
    with pytest.raises(ValueError, match="needs a path"):
        pg.init_url("file")
    with pytest.raises(ValueError, match="unknown init method 'udp'"):
        pg.init_url("udp")


def test_a_missing_variable_is_named_in_the_error():
    errors = spawn(pg.what_init_needs, 1, init_process_group=False, timeout=60)[0]
    assert list(errors) == list(pg.INIT_VARIABLES)
    for variable, message in errors.items():
        assert variable in message and "expected, but not set" in message


def test_process_and_mp_spawn_launchers_return_results_by_rank():
    assert pg.launch_with_process(world_size=2, timeout=90) == [3.0, 3.0]
    assert pg.launch_with_mp_spawn(world_size=2, timeout=90) == [3.0, 3.0]


def _defined_in_main(rank, world_size):
    return rank


def test_raw_mp_spawn_of_a_main_function_reports_cant_get_attribute(monkeypatch):
    # What a notebook does: the worker is an attribute of __main__ in the parent only.
    monkeypatch.setattr(_defined_in_main, "__module__", "__main__")
    monkeypatch.setattr(sys.modules["__main__"], "_defined_in_main", _defined_in_main, raising=False)
    with pytest.raises(RuntimeError, match="Can't get attribute '_defined_in_main'"):
        pg.raw_mp_spawn(_defined_in_main, nprocs=2, timeout=90)


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_subgroups_reduce_only_inside_their_group(world_size):
    results = spawn(pg.subgroup_sums, world_size, timeout=60)
    evens, odds = list(range(0, world_size, 2)), list(range(1, world_size, 2))
    for rank, r in enumerate(results):
        members = evens if rank % 2 == 0 else odds
        assert r["members"] == members
        assert r["group_rank"] == members.index(rank)
        assert r["group_size"] == len(members)
        assert r["group_sum"] == float(sum(members))
        assert r["world_sum"] == float(sum(range(world_size)))


def test_barrier_makes_every_rank_see_rank0s_file(tmp_path):
    results = spawn(pg.prepare_then_read, 3, args=(str(tmp_path / "data.txt"), True, 0.5), timeout=60)
    assert results == ["prepared by rank 0"] * 3
    assert not list(tmp_path.glob("*.tmp"))  # written through a temporary name, then renamed


def test_a_missed_collective_times_out_on_the_waiting_rank():
    results = spawn(pg.missed_collective, 2, args=(1.0,), init_process_group=False, timeout=60)
    assert results[0]["outcome"].endswith(": timed out")
    assert results[0]["waited >= timeout"] is True
    assert results[1]["outcome"] == "never called all_reduce"


def test_lifecycle_after_destroy_no_collective_works():
    results = spawn(pg.lifecycle, 2, init_process_group=False, timeout=60)
    assert results[0] == results[1]
    states = dict(results[0])
    assert states["before init"] == "is_initialized=False"
    assert states["after init"] == "is_initialized=True, world_size=2"
    assert states["after destroy"] == "is_initialized=False"
    assert states["all_reduce after destroy"].startswith("ValueError: Default process group")


def test_an_unknown_init_method_fails_the_worker_not_hangs_it():
    with pytest.raises(WorkerError, match="unknown init method"):
        spawn(pg.join_with, 1, args=("udp",), init_process_group=False, timeout=60)


def test_module_runs_alone_as_a_world_of_one():
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR")}
    proc = subprocess.run([sys.executable, "-m", "ddp_tutorial.process_groups"], capture_output=True,
                          text=True, timeout=90, env=env, cwd=Path(__file__).parent)
    assert proc.returncode == 0, proc.stderr
    assert "rank 0 of 1" in proc.stdout and "process groups: OK" in proc.stdout
