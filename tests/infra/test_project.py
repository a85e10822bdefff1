"""The project's set-up files agree with each other."""

from __future__ import annotations

import json
import re
import subprocess

try:
    import tomllib
except ImportError:  # Python < 3.11
    import tomli as tomllib
from pathlib import Path

from ddp_tutorial.doctor import FLOORS

ROOT = Path(__file__).resolve().parents[2]
# conda-forge names that differ from PyPI's
CONDA_TO_PIP = {"pytorch-cpu": "torch", "pytorch-gpu": "torch", "pytorch": "torch"}
MAINTAINER_EXTRAS = ("dev", "browser", "site")  # dev only names the others
REQ = re.compile(r"^\s*([A-Za-z0-9_.\-]+)\s*(.*)$")


def _split(requirement: str) -> tuple[str, str]:
    name, spec = REQ.match(requirement).groups()
    return name.lower().replace("_", "-"), spec.replace(" ", "")


def pyproject_requirements(maintainer_tools: bool = False) -> dict[str, str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    # the maintainers' tools (make site, the browser tests) are not part of a learner's conda env
    skip = ("dev",) if maintainer_tools else MAINTAINER_EXTRAS
    reqs = project["dependencies"] + [r for key, rs in extras.items() if key not in skip for r in rs]
    return dict(_split(r) for r in reqs)


def conda_requirements() -> dict[str, str]:
    reqs = {}
    in_deps = False
    for line in (ROOT / "environment.yml").read_text().splitlines():
        if line.startswith("dependencies:"):
            in_deps = True
            continue
        match = re.match(r"^  - ([^\s:#]+)\s*$", line) if in_deps else None
        if match:
            name, spec = _split(match.group(1))
            if name not in ("python", "pip"):
                reqs[CONDA_TO_PIP.get(name, name)] = spec
    return reqs


def test_environment_yml_and_pyproject_list_the_same_dependencies():
    pip_reqs, conda_reqs = pyproject_requirements(), conda_requirements()
    assert len(pip_reqs) >= 10  # the parsers found the lists
    assert conda_reqs == pip_reqs


def conda_python_spec() -> str:
    match = re.search(r"^  - python\s*([^\s#]+)\s*$", (ROOT / "environment.yml").read_text(), re.MULTILINE)
    assert match, "environment.yml names no python version"
    return match.group(1)


def test_the_floors_are_the_doctors():
    """pyproject.toml and environment.yml install exactly the floors the doctor checks (README "Versions")."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["requires-python"] == f">={FLOORS['python']}"
    assert conda_python_spec() == f">={FLOORS['python']}"
    reqs = pyproject_requirements()
    for name in ("torch", "torchvision"):
        assert reqs[name] == f">={FLOORS[name]}", f"pyproject.toml: {name}{reqs[name]}, doctor: >={FLOORS[name]}"
    # environment.yml's torch and torchvision equal pyproject's: the test above checks that


def test_readme_states_the_floors():
    text = (ROOT / "README.md").read_text()
    section = text[text.index("### Versions"):]
    section = section[:section.index("\n## ")]
    for name, floor in FLOORS.items():
        assert f"{name} {floor}" in section.lower(), f"README.md Versions does not name {name} {floor}"


def test_no_exact_pins():
    for name, spec in pyproject_requirements(maintainer_tools=True).items():
        assert "==" not in spec, f"{name} is pinned exactly: use a range"


def test_environment_yml_installs_the_package_itself():
    assert "- -e ." in (ROOT / "environment.yml").read_text()


def test_ci_runs_the_readme_test_command():
    assert "make test" in (ROOT / ".ci" / "run").read_text()
    assert "make test" in (ROOT / "README.md").read_text()


def _make(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "-s", *args], cwd=ROOT, capture_output=True, text=True, timeout=60)


def test_make_test_versions_pins_the_floors_and_runs_the_make_test_flags():
    """`make test-versions` (dry run: no venv built) installs FLOORS' releases on the oldest side, the
    newest torch on the other, and runs unit tests and nbval with the flags `make unit`/`make nbval` use."""
    done = _make("-n", "test-versions", "PYTHON_OLDEST=/opt/py-oldest", "PYTHON_NEWEST=/opt/py-newest")
    assert done.returncode == 0, done.stderr
    plan = done.stdout
    pins = "torch==" + FLOORS["torch"] + ".* torchvision==" + FLOORS["torchvision"] + ".*"
    # README: the oldest compares only the notebooks that branch by release
    assert "py='/opt/py-oldest'; pins=\"" + pins + "\"; runs=\"unit nbval-release\"" in plan
    assert "py='/opt/py-newest'; pins=\"--upgrade torch torchvision\"; runs=\"unit-fast nbval\"" in plan
    assert plan.startswith("set -f;")  # the pins' * are not file patterns
    assert "sys.version_info[:2] != tuple(map(int, v)))'; then" in plan and 'v = "' + FLOORS["python"] + '"' in plan
    unit = _make("-n", "unit", "-o", ".venv/.installed").stdout
    nbval = _make("-n", "nbval", "-o", ".venv/.installed").stdout
    xdist = unit.split(" -m pytest ")[1].split(" --durations")[0]
    nbval_flags = nbval.split(xdist)[1].split(" notebooks")[0]
    assert xdist.startswith("-n ") and "--nbval" in nbval_flags
    assert plan.count(f"DDP_TUTORIAL_EXERCISES_FRESH=1 $venv/bin/python -m pytest {xdist} ") == 4
    assert f"{nbval_flags} notebooks" in plan and " tests ||" in plan
    # unit-fast (the newest side) leaves out what make test leaves out; make test-slow runs it on the same torch
    assert f'{xdist} -q -p no:cacheprovider -m "not slow" tests ||' in plan
    assert f"{nbval_flags} notebooks/14_sharding.ipynb" in plan  # nbval-release: the listed notebooks


# What makes a lesson's stored output depend on the torch release: code that asks which release runs,
# or DCP, whose warnings changed between releases (2.9 prints TypedStorage's deprecation).
BY_RELEASE = re.compile(r"older_than\(|runs_here\(|torch\.__version__|torch\.distributed\.checkpoint")
LESSON_IMPORT = re.compile(r"(?:from|import) (ddp_tutorial(?:\.\w+)+)")


def release_branching_notebooks() -> set[str]:
    """Notebooks whose cells, or the lesson modules they import (one level down), match BY_RELEASE."""
    def module_text(name: str) -> str:
        path = ROOT / (name.replace(".", "/") + ".py")
        if not path.is_file():
            path = ROOT / name.replace(".", "/") / "__init__.py"
        return path.read_text() if path.is_file() else ""

    found = set()
    for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
        code = "\n".join("".join(c["source"]) for c in json.loads(nb.read_text())["cells"] if c["cell_type"] == "code")
        modules = {m for m in LESSON_IMPORT.findall(code) if ".exercises" not in m and ".bench" not in m}
        texts = [code] + [module_text(m) for m in modules]
        texts += [module_text(d) for t in texts[1:] for d in LESSON_IMPORT.findall(t)]
        if any(BY_RELEASE.search(t) for t in texts):
            found.add(f"notebooks/{nb.name}")
    return found


def test_the_oldest_run_compares_every_notebook_that_branches_by_release():
    listed = set(re.search(r"RELEASE_NOTEBOOKS := ((?:.*\\\n)*.*)", (ROOT / "Makefile").read_text())
                 .group(1).replace("\\\n", " ").split())
    found = release_branching_notebooks()
    assert {"notebooks/19_pipeline_schedules.ipynb", "notebooks/22_capstone.ipynb"} <= found  # the finder finds
    assert found <= listed, f"add to the Makefile's RELEASE_NOTEBOOKS: {sorted(found - listed)}"


def test_make_test_versions_names_a_missing_interpreter():
    done = _make("test-versions", "VERSIONS=oldest", "PYTHON_OLDEST=/nonexistent/python")
    assert done.returncode != 0
    assert f"test-versions: oldest: missing Python {FLOORS['python']} (PYTHON_OLDEST=" in done.stdout
    done = _make("test-versions", "VERSIONS=newest", "PYTHON_NEWEST=")
    assert done.returncode != 0 and "test-versions: newest: missing the newest Python" in done.stdout


def test_ci_runs_the_versions_it_claims():
    assert "make test-versions" in (ROOT / ".ci" / "run").read_text()
