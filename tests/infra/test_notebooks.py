"""The stored notebooks follow DESIGN.md's notebook rules (checked without running them).

nbval compares what is stored; these checks keep out what would make that comparison
depend on the machine: torch/Python message text, long floats, paths, and the like.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[2] / "notebooks").glob("*.ipynb"))
TAGS = {"nbval-ignore-output", "nbval-skip", "raises-exception", "nbval-raises-exception"}
# A float with 6 or more decimals is a fact about the CPU's kernels, not about the lesson.
LONG_FLOAT = re.compile(r"(?<![\w.])-?\d+\.\d{6,}(?![\d])")
PATH = re.compile(r"(?<![\w.])/(tmp|home|root|work|usr|opt|var)/")
DOUBLED = re.compile(r"\[rank (\d+)\] rank \1\b")


def code_cells(path: Path):
    for index, cell in enumerate(json.loads(path.read_text())["cells"]):
        if cell["cell_type"] == "code":
            yield index, cell, set(cell.get("metadata", {}).get("tags", []))


def stored_text(cell) -> str:
    parts = []
    for out in cell.get("outputs", []):
        if out["output_type"] == "stream":
            parts.append("".join(out["text"]))
        elif out["output_type"] in ("execute_result", "display_data"):
            parts.append("".join(out["data"].get("text/plain", "")))
        elif out["output_type"] == "error":
            parts.append(out["evalue"])
    return "".join(parts)


def compared(tags: set) -> bool:
    return not tags & {"nbval-ignore-output", "nbval-skip"}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_cell_tags_not_comments(path):
    for index, cell, tags in code_cells(path):
        source = "".join(cell["source"])
        assert "NBVAL_" not in source, f"{path.name} cell {index}: use a cell tag, not a # NBVAL_ comment"
        assert tags <= TAGS | {"hide-input", "hide-output", "remove-input"}, f"{path.name} cell {index}: {tags}"


def coalesced(outputs: list[dict]) -> list[dict]:
    """Outputs as Jupyter shows them: consecutive chunks of one stream are one output. The kernel
    flushes a stream on a timer, so a print can land as its text, then its newline (under load)."""
    merged: list[dict] = []
    for out in outputs:
        if out["output_type"] == "stream" and merged and merged[-1].get("name") == out["name"] \
                and merged[-1]["output_type"] == "stream":
            merged[-1] = {**merged[-1], "text": "".join(merged[-1]["text"]) + "".join(out["text"])}
        else:
            merged.append(out)
    return merged


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_executed_and_stored_cleanly(path):
    for index, cell, tags in code_cells(path):
        where = f"{path.name} cell {index}"
        assert cell.get("execution_count") is not None or "nbval-skip" in tags, f"{where} was not executed"
        for out in coalesced(cell.get("outputs", [])):
            if out["output_type"] == "stream":
                assert "".join(out["text"]).strip(), f"{where}: an empty {out['name']} output"
            if out["output_type"] == "error":
                assert tags & {"raises-exception", "nbval-raises-exception"}, f"{where} stored an error"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_compared_outputs_do_not_depend_on_the_machine(path):
    for index, cell, tags in code_cells(path):
        if not compared(tags):
            continue
        text, where = stored_text(cell), f"{path.name} cell {index}"
        assert not LONG_FLOAT.findall(text), f"{where} prints {LONG_FLOAT.findall(text)[:3]}: round it"
        assert not PATH.search(text), f"{where} prints a path: {PATH.search(text).group(0)}..."
        assert not DOUBLED.search(text), f"{where} doubles the rank prefix: {DOUBLED.search(text).group(0)}"
        assert "Traceback (most recent call last)" not in text, f"{where} stores a traceback"


@pytest.mark.parametrize("path", [p for p in NOTEBOOKS if not p.name.startswith("13_")], ids=lambda p: p.stem)
def test_a_lesson_never_imports_the_benchmarks(path):
    # DESIGN.md: lessons use lesson modules; bench/ measures them (lesson 13, the performance
    # lab, reads the benchmarks' stored reference run on purpose). A lesson may run a benchmark's
    # command line as a learner would in a shell (lesson 23 runs `python -m ddp_tutorial.bench
    # roofline` and reads its --json), never import it.
    for index, cell, _ in code_cells(path):
        source = "".join(cell["source"])
        assert not re.search(r"(from|import)\s+ddp_tutorial\.bench\b", source), f"{path.name} cell {index} imports bench/"


def test_no_lesson_module_imports_the_benchmarks():
    package = Path(__file__).resolve().parents[2] / "ddp_tutorial"
    for module in package.rglob("*.py"):
        if "bench" in module.relative_to(package).parts:
            continue
        for line in module.read_text().splitlines():
            assert not re.match(r"\s*(from|import) ddp_tutorial\.bench\b", line), f"{module.name}: {line.strip()}"


# What JupyterLab writes into a notebook when it opens and saves it (issue 18): stored as is, a
# notebook opened and saved without running it stays byte-identical (git status stays clean).
# The kernelspec is the one `ipykernel install` (make install) registers. language_info comes
# from the kernel on every start (and from `make notebooks`): stored from the reference venv.
LAB_KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}
LAB_LANGUAGE_INFO = {"codemirror_mode": {"name": "ipython", "version": 3}, "file_extension": ".py",
                     "mimetype": "text/x-python", "name": "python", "nbconvert_exporter": "python",
                     "pygments_lexer": "ipython3"}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_stored_as_jupyterlab_saves_it(path):
    nbformat = pytest.importorskip("nbformat")
    text = path.read_text()
    nb = nbformat.reads(text, as_version=nbformat.NO_CONVERT)
    assert (nb.nbformat, nb.nbformat_minor) >= (4, 5), f"{path.name}: nbformat {nb.nbformat}.{nb.nbformat_minor}"
    assert nb.metadata.get("kernelspec") == LAB_KERNELSPEC, f"{path.name}: kernelspec {nb.metadata.get('kernelspec')}"
    info = dict(nb.metadata.get("language_info", {}))
    assert re.fullmatch(r"3\.\d+\.\d+", info.pop("version", "")), f"{path.name}: language_info.version"
    assert info == LAB_LANGUAGE_INFO, f"{path.name}: language_info {info}"
    for index, cell in enumerate(nb.cells):
        # JupyterLab keeps a code cell's hidden outputs in both flags; with only one it adds the other
        hidden = cell.metadata.get("jupyter", {}).get("outputs_hidden", False)
        if cell.cell_type == "code" and (hidden or "collapsed" in cell.metadata):
            assert cell.metadata.get("collapsed") is True and hidden, \
                f"{path.name} cell {index}: hidden outputs need collapsed: true and jupyter.outputs_hidden: true"
    # the server writes with nbformat.write: indent 1, sorted keys, lines split, a final newline
    assert text == nbformat.writes(nb, version=nbformat.NO_CONVERT) + "\n", \
        f"{path.name} is not stored as Jupyter writes it: re-save it with nbformat.write"


# An outline item: "1. ...", at a line's start or inline after a comma ("4. `barrier`, 5. timeouts").
OUTLINE_ITEM = re.compile(r"(?m)(?:^|[\s,;(])(\d{1,2})\.\s+(?=\S)")
SECTION = re.compile(r"(?m)^## (\d+)\.")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_the_opening_outline_lists_exactly_the_numbered_sections(path):
    """A lesson that opens with a numbered outline promises its sections: the same numbers, in order,
    as its ``## N.`` headings (a section added or merged later must update the outline)."""
    cells = json.loads(path.read_text())["cells"]
    outline = [int(n) for n in OUTLINE_ITEM.findall("".join(cells[0]["source"]))]
    sections = [int(n) for cell in cells if cell["cell_type"] == "markdown"
                for n in SECTION.findall("".join(cell["source"]))]
    if outline:
        assert outline == sections, f"{path.name}: the outline numbers {outline}, the sections {sections}"


SHOWS_A_SOLUTION = re.compile(r"ddp_tutorial\.exercises\.solutions|solution\s*=\s*True")
HIDDEN_CELL = {"collapsed": True, "jupyter": {"outputs_hidden": True, "source_hidden": True}}


def solution_cells(path: Path) -> list[int]:
    """The code cells of a lesson that show an exercise's reference solution."""
    cells = json.loads(path.read_text())["cells"]
    return [i for i, c in enumerate(cells) if c["cell_type"] == "code" and SHOWS_A_SOLUTION.search("".join(c["source"]))]


def test_lessons_show_solutions():  # so that the test below cannot pass on a pattern that matches nothing
    assert sum(len(solution_cells(p)) for p in NOTEBOOKS) >= 20


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_no_solution_is_on_the_page_until_asked_for(path):
    """Issue 37: a cell that shows a solution is collapsed in JupyterLab, source and output alike (the
    website hides the same cells: docs/course_site.site_notebook, tests/browser/test_site.py)."""
    cells = json.loads(path.read_text())["cells"]
    for index in solution_cells(path):
        metadata = {k: v for k, v in cells[index]["metadata"].items() if k in HIDDEN_CELL}
        assert metadata == HIDDEN_CELL, (
            f"{path.name} cell {index} shows a solution in plain sight: collapse it after the walkthrough "
            f"with metadata {HIDDEN_CELL} (as notebooks/02_process_groups.ipynb cell 23)")
