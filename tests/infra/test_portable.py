"""`make nbval-portable` runs the notebooks on other CPU kernels, and really does.

torch picks its CPU kernels by vector ISA when it is imported; ATEN_CPU_CAPABILITY
overrides the pick, but an invalid value is ignored with only a warning.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run(code: str, capability: str) -> str:
    env = dict(os.environ, ATEN_CPU_CAPABILITY=capability, PYTHONPATH=str(Path(__file__).parent))  # portable_workers
    done = subprocess.run([sys.executable, "-W", "ignore", "-c", code], env=env, capture_output=True,
                          text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.mark.slow  # make test stays under 12 minutes; make test-slow and CI run it
@pytest.mark.timeout(180)
def test_spawned_ranks_run_the_kernels_the_caller_asked_for():
    # The forkserver that forks the ranks imports torch once: it must see the variable too.
    code = ("from ddp_tutorial.launch import spawn; import portable_workers as w; "
            "print(spawn(w.cpu_capability, world_size=2, init_process_group=False))")
    assert run(code, "default") == "['DEFAULT', 'DEFAULT']"


def make_portable(capabilities: str) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "-s", "-o", ".venv/.installed", "nbval-portable", f"CAPABILITIES={capabilities}",
                           f"PY={sys.executable}"], cwd=ROOT, capture_output=True, text=True, timeout=60)


@pytest.mark.slow  # runs make; CI runs the target itself after make test
@pytest.mark.timeout(120)
def test_make_target_skips_a_capability_torch_ignores():
    # "sve256" is an ARM capability: on x86 torch ignores it, and so must the target,
    # saying why, instead of running nbval on the native kernels and calling it portable.
    native = run("import torch; print(torch.backends.cpu.get_cpu_capability().lower())", "")
    bogus = "sve256" if native != "sve256" else "avx2"
    done = make_portable(bogus)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"skipping {bogus}: torch runs {native} kernels" in done.stdout
    assert "nbval-portable: every notebook" not in done.stdout


def test_ci_runs_the_portable_target_after_make_test():
    ci = (ROOT / ".ci" / "run").read_text()
    assert ci.index("make test") < ci.index("make nbval-portable")
