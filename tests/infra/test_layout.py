"""The package's layout is the course's: parts in folders, imports pointing down, every command real.

Read from the source with ``ast`` (nothing imported), so a broken rule names the file and line.
"""

from __future__ import annotations

import ast
import json
import re
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "ddp_tutorial"
TESTS = ROOT / "tests"
# The lesson parts, bottom to top in the course's order; a part may import the ones before it.
# training (the loop, data, checkpoints) sits under data_parallel: lesson 07 saves its checkpoint and
# samples its data with training's helpers, and the training program uses torch's DDP, not the lessons'.
# In course order: a part may import only the parts before it. The last three are the LLM-scale
# ladder's (issues 29-31); a part listed here need not exist yet, a folder not listed fails.
PARTS = ("comm", "training", "data_parallel", "cluster", "pipeline_parallel", "sharding", "tensor_parallel",
         "context_parallel", "expert_parallel", "capstone", "performance")
SHARED = {"__init__", "__main__", "doctor", "gpu_check", "gpu_items", "nbtools", "timing", "models"}
SHARED_PACKAGES = ("models",)  # a shared module grown into a package (one module per model family)
BOTTOM = ("env", "launch")  # every part may use them; they use no part
TOP = ("pitfalls", "bench", "exercises", "plots")  # may use any part; no part uses them
# paired on purpose: a stub and its solution share the learner's file name
SAME_NAME_OK = ("exercises/stubs", "exercises/solutions")
MODULE_COMMAND = re.compile(r"-m (ddp_tutorial(?:\.\w+)*)")


def modules() -> dict[str, Path]:
    """Dotted name -> file, for every module of the package."""
    out = {}
    for path in PKG.rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


MODULES = modules()


def imports(path: Path) -> list[tuple[str, list[str], int]]:
    """(module, imported names, line) for every ``ddp_tutorial`` import in a file, relative ones resolved."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = list(path.relative_to(ROOT).with_suffix("").parts)
                package = package[:len(package) - node.level]
                base = ".".join(package + ([base] if base else []))
            if base.startswith("ddp_tutorial"):
                found.append((base, [a.name for a in node.names], node.lineno))
        elif isinstance(node, ast.Import):
            found += [(a.name, [], node.lineno) for a in node.names if a.name.startswith("ddp_tutorial")]
    return found


def group(module: str) -> str:
    """The folder a module belongs to: a part, env, launch, the top layer, or "shared"."""
    parts = module.split(".")
    if parts[1:2] and parts[1] in SHARED_PACKAGES:
        return "shared"
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and (PKG / parts[1]).is_dir()) else "shared"


def dependencies(module: str) -> set[str]:
    deps = set()
    for base, names, _ in imports(MODULES[module]):
        for name in names or [""]:
            full = f"{base}.{name}" if name else base
            deps.add(full if full in MODULES else base)
    return {d for d in deps if d in MODULES and d != module}


def test_the_top_level_shows_the_parts_and_at_most_8_shared_modules():
    top = sorted(p.stem for p in PKG.glob("*.py"))
    shared = top + [name for name in SHARED_PACKAGES if (PKG / name / "__init__.py").is_file()]
    assert set(shared) <= SHARED and len(shared) <= 8, shared
    folders = {p.name for p in PKG.iterdir() if (p / "__init__.py").is_file()} - set(SHARED_PACKAGES)
    assert set(BOTTOM) | set(TOP) | set(PARTS[:7]) <= folders <= set(PARTS) | set(BOTTOM) | set(TOP), folders


def test_no_import_cycle_between_modules():
    graph = {m: dependencies(m) for m in MODULES}
    done, on_path = set(), []

    def visit(m):
        if m in on_path:
            raise AssertionError("import cycle: " + " -> ".join(on_path[on_path.index(m):] + [m]))
        if m in done:
            return
        on_path.append(m)
        for d in sorted(graph[m]):
            if not m.startswith(d + "."):  # a package's __init__ importing its own modules is not a cycle
                visit(d)
        on_path.pop()
        done.add(m)

    for m in sorted(graph):
        visit(m)


def test_imports_point_down_the_course():
    """env/launch use no part; a part uses only earlier parts; no part uses the top layer."""
    order = {p: i for i, p in enumerate(PARTS)}
    wrong = []
    for m in MODULES:
        g = group(m)
        for d in dependencies(m):
            h = group(d)
            if g == h or h in BOTTOM or (h == "shared" and g not in BOTTOM):
                continue
            allowed = (g in TOP and h in PARTS + TOP) or (g in order and h in order and order[h] < order[g]) \
                or (g == "launch" and h == "env") or (g == "shared" and h in PARTS + BOTTOM)
            if g == "shared" and h in PARTS and m != "ddp_tutorial.doctor":
                allowed = False  # models, timing, nbtools serve the parts; only the doctor runs a lesson
            if not allowed:
                wrong.append(f"{m} ({g}) imports {d} ({h})")
    assert not wrong, "\n".join(wrong)


def test_no_underscore_name_is_imported_from_another_module():
    used = [f"{path.relative_to(ROOT)}:{line} imports {base}.{name}"
            for path in list(PKG.rglob("*.py")) + list(TESTS.rglob("*.py"))
            for base, names, line in imports(path) for name in names
            if name.startswith("_") and not name.startswith("__")]
    assert not used, "\n".join(used)


def test_no_two_modules_share_a_file_name():
    names = Counter(p.name for p in PKG.rglob("*.py")
                    if p.name not in ("__init__.py", "__main__.py")
                    and not any(str(p.parent).endswith(pair) for pair in SAME_NAME_OK))
    assert [n for n, count in names.items() if count > 1] == []


def test_each_part_lists_its_modules_in_its_docstring():
    for part in (p for p in PARTS if (PKG / p).is_dir()):
        doc = ast.get_docstring(ast.parse((PKG / part / "__init__.py").read_text())) or ""
        listed = re.findall(r"^- ``(\w+)``", doc, re.M)
        present = sorted(p.stem for p in (PKG / part).glob("*.py") if p.stem not in ("__init__", "__main__"))
        assert sorted(listed) == present, (part, listed, present)


def command_sources() -> list[tuple[str, str]]:
    """(where, text) for the README, the docs, the job scripts, the package and the notebooks' cells."""
    files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "docs").glob("*.py")),
             *sorted((PKG / "cluster").glob("*.sbatch")), *sorted(PKG.rglob("*.py")), ROOT / "Makefile"]
    out = [(str(f.relative_to(ROOT)), f.read_text()) for f in files]
    for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
        cells = json.loads(nb.read_text())["cells"]
        out += [(f"{nb.name} cell {i}", "".join(c["source"])) for i, c in enumerate(cells)]
    return out


def runnable(module: str) -> bool:
    """A module ``python -m`` runs: a module with a ``__main__`` block, or a package with ``__main__.py``."""
    path = MODULES.get(module)
    if path is None:
        return False
    if path.name == "__init__.py":
        return (path.parent / "__main__.py").is_file()
    return '__name__ == "__main__"' in path.read_text()


def test_every_module_command_names_a_module_that_runs():
    commands = {(m, where) for where, text in command_sources() for m in MODULE_COMMAND.findall(text)}
    assert len({m for m, _ in commands}) > 20  # the pattern still finds the course's commands
    broken = sorted(f"{where}: -m {m}" for m, where in commands if not runnable(m))
    assert not broken, "\n".join(broken)


@pytest.mark.parametrize("module", sorted(m for m in MODULES if group(m) in PARTS + BOTTOM + TOP + ("shared",)
                                          and not m.endswith("__main__") and m.count(".") >= 1
                                          and not m.startswith(("ddp_tutorial.exercises.stubs",
                                                                "ddp_tutorial.exercises.solutions"))))
def test_every_module_has_a_test_file_or_a_named_cover(module):
    """``test_<name>.py`` somewhere under tests/, or a test file whose docstring names the module
    (````ddp_tutorial.part.name```` or ````ddp_tutorial.part.*````)."""
    name = module.rsplit(".", 1)[1]
    if MODULES[module].name == "__init__.py" or list(TESTS.rglob(f"test_{name}.py")):
        return
    package = module.rsplit(".", 1)[0]
    covered = [t for t in TESTS.rglob("test_*.py")
               if re.search(rf"``({re.escape(module)}|{re.escape(package)}\.\*)``",
                            ast.get_docstring(ast.parse(t.read_text())) or "")]
    assert covered, f"{module}: no tests/**/test_{name}.py, and no test file's docstring names it"


def test_every_noqa_says_why():
    bare = re.compile(r"#\s*noqa(:\s*[A-Z]+[0-9]+(,\s*[A-Z]+[0-9]+)*)?\s*$")
    found = [f"{path.relative_to(ROOT)}:{i}" for path in [*PKG.rglob("*.py"), *TESTS.rglob("*.py"),
                                                         *(ROOT / "docs").glob("*.py")]
             for i, line in enumerate(path.read_text().splitlines(), 1) if bare.search(line)]
    assert not found, "a # noqa without its reason: " + ", ".join(found)
