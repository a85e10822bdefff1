"""The doctor (`python -m ddp_tutorial`) and the notebook helpers."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from ddp_tutorial.nbtools import rounded


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
