"""The doctor (`python -m ddp_tutorial`) and the notebook helpers."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from ddp_tutorial.doctor import FLOORS, floor_problem, older_than, release
from ddp_tutorial.nbtools import rounded


@pytest.mark.slow  # make test stays under 12 minutes; make test-slow and CI run it
@pytest.mark.timeout(120)
def test_doctor_passes_on_this_machine_and_runs_the_all_reduce():
    out = subprocess.run([sys.executable, "-m", "ddp_tutorial"], capture_output=True, text=True, timeout=100)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "2-rank all_reduce through launch.spawn: OK" in out.stdout
    assert f"torch        {torch.__version__}" in out.stdout


def test_doctor_rejects_a_bad_world_size():
    out = subprocess.run([sys.executable, "-m", "ddp_tutorial", "--world-size", "0"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "--world-size must be >= 1" in out.stderr


def test_rounded_reaches_into_containers_and_tensors():
    value = {"a": [1.23456789, (-0.00001, 2)], "t": torch.tensor([0.123456, 1.0])}
    assert rounded(value, 3) == {"a": [1.235, (0.0, 2)], "t": [0.123, 1.0]}
    assert str(rounded(-0.00001, 3)) == "0.0"  # no "-0.0" in notebook outputs


@pytest.mark.parametrize("version, expected", [
    ("2.14.1+cpu", (2, 14, 1)), ("2.8.0a0+gitabc123", (2, 8, 0)), ("2.9.0.dev20250701+cu128", (2, 9, 0)),
    ("3.10", (3, 10)), ("v0.23.0", (0, 23, 0)), ("dev", None), ("", None)])
def test_release_reads_the_leading_numbers(version, expected):
    assert release(version) == expected


@pytest.mark.parametrize("version, floor, older", [
    ("2.7.1", "2.8", True), ("2.5.1+cu121", "2.8", True), ("1.13.1", "2.8", True),
    ("2.8", "2.8", False), ("2.8.0", "2.8", False), ("2.8.0+cpu", "2.8", False),
    ("2.8.0a0+git1234", "2.8", False),  # a source build of the floor release counts as that release
    ("2.7.0a0+git1234", "2.8", True),
    ("2.10.0", "2.8", False),  # numbers, not strings: 10 > 8
    ("2.14.1+cpu", "2.8", False), ("3.0.0", "2.8", False),
    ("3.9.18", "3.10", True), ("3.10.0", "3.10", False), ("3.13.1", "3.10", False),
    ("dev", "2.8", None)])  # unreadable: not a verdict either way
def test_older_than_compares_release_numbers(version, floor, older):
    assert older_than(version, floor) is older


def test_floor_problem_says_what_to_install():
    assert floor_problem("torch", "2.5.1", "2.8") == (
        "torch 2.5.1 is older than 2.8, the oldest release this course runs on: pip install -U 'torch>=2.8'")
    assert floor_problem("python", "3.9.18", "3.10").startswith("Python 3.9.18 is older than 3.10, ")
    assert "install Python 3.10 or newer" in floor_problem("python", "3.9.18", "3.10")
    for fine in ("2.8.0", "2.14.1+cpu", "dev", "missing"):
        assert floor_problem("torch", fine, "2.8") is None


def test_this_machine_is_at_or_above_every_floor():
    import platform

    import torchvision

    for name, version in [("python", platform.python_version()), ("torch", torch.__version__),
                          ("torchvision", torchvision.__version__)]:
        assert not older_than(version, FLOORS[name]), f"{name} {version} < {FLOORS[name]}"


def test_doctor_fails_on_a_torch_below_the_floor(monkeypatch, capsys):
    from ddp_tutorial import doctor

    found = doctor.versions()
    monkeypatch.setattr(doctor, "versions", lambda: dict(found, torch="2.5.1"))
    monkeypatch.setattr(doctor, "check_all_reduce", lambda world_size: 0.01)  # not what is tested here
    assert doctor.main([]) == 1
    out = capsys.readouterr().out
    assert f"torch 2.5.1 is older than {FLOORS['torch']}, the oldest release this course runs on: " \
           f"pip install -U 'torch>={FLOORS['torch']}'" in out
