"""Small helpers for the notebooks: show the code that runs, keep printed numbers stable."""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any


def show_source(*objects: Any) -> None:
    """Print the source of functions, classes or modules, so the notebook shows exactly what runs.

    In Jupyter it is shown as a highlighted Markdown code block: unlike
    ``IPython.display.Code`` its stored output does not depend on the Pygments
    version, so nbval compares it reliably.
    """
    text = "\n\n".join(inspect.getsource(obj).rstrip() for obj in objects)
    try:
        from IPython import get_ipython
        from IPython.display import Markdown, display

        if get_ipython() is not None:
            display(Markdown(f"```python\n{text}\n```"))
            return
    except ImportError:
        pass
    print(text)


def each_float(value: Any, fn: Callable[[float], float]) -> Any:
    """Apply ``fn`` to every float, also inside lists, tuples, dicts and tensors."""
    if isinstance(value, float):
        return fn(value) + 0.0  # + 0.0 turns -0.0 into 0.0
    if isinstance(value, dict):
        return {k: each_float(v, fn) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(each_float(v, fn) for v in value)
    if hasattr(value, "tolist") and hasattr(value, "dtype"):
        return each_float(value.tolist(), fn)
    return value


def rounded(value: Any, digits: int = 4) -> Any:
    """Round floats (also inside lists, tuples, dicts and tensors) to ``digits`` decimals."""
    return each_float(value, lambda x: round(x, digits))


def significant(value: Any, digits: int = 3) -> Any:
    """Round floats (also inside containers and tensors) to ``digits`` significant digits.

    A loss printed as 0.0241 on one CPU is 0.02412 or 0.02409 on another: float sums are
    reordered by each vector ISA's kernels. Print what the lesson needs, assert the rest.
    """
    return each_float(value, lambda x: float(f"{x:.{digits}g}"))


def error_summary(error: BaseException, *phrases: str) -> str:
    """A caught error as one stable line: its type and the key phrases its message holds.

    torch's and Python's message texts change between releases, so a compared
    notebook output shows this summary; the verbatim text, where it is the lesson,
    goes in a cell tagged ``nbval-ignore-output``. Raises ``AssertionError`` (with the
    full message) when a phrase is missing, so a changed meaning never goes unnoticed.
    """
    text = str(error)
    missing = [p for p in phrases if p not in text]
    if missing:
        raise AssertionError(f"{type(error).__name__} lacks {missing}; its message was:\n{text}")
    name = type(error).__name__
    if getattr(error, "rank", None) is not None and name.startswith("Worker"):
        name += f" from rank {error.rank}"
        cause = text.partition(" failed: ")[2].partition(":")[0]  # "rank 1 failed: RuntimeError: ..."
        if cause.isidentifier():
            name += f" ({cause})"
    said = ", ".join(repr(p) for p in phrases)
    return f"{name}: says {said}" if phrases else name


def show_error(error: BaseException, *phrases: str, label: str = "") -> None:
    """Print ``error_summary(error, *phrases)``, after ``label`` when given."""
    print(f"{label}{error_summary(error, *phrases)}")


def short_paths(text: str, **folders: str) -> str:
    """``text`` with this machine's folders written the way any learner's would read.

    The course's checkout becomes ``ddp_tutorial/...``, the Python environment's packages
    ``<site-packages>/...``, and each ``name=folder`` given (a temporary folder) ``<name>``:
    a stored output (and the website) must not publish the writer's paths (``16_cluster``).
    """
    import site
    import sysconfig
    from pathlib import Path

    import ddp_tutorial

    replace = {str(Path(ddp_tutorial.__file__).resolve().parent.parent) + "/": ""}
    for packages in {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], *site.getsitepackages()}:
        replace[str(Path(packages).resolve()) + "/"] = "<site-packages>/"
        replace[packages + "/"] = "<site-packages>/"
    replace.update({str(folder): f"<{name}>" for name, folder in folders.items()})
    for old in sorted(replace, key=len, reverse=True):  # the longest first: a venv inside the checkout
        text = text.replace(old, replace[old])
    return text


# What lessons 01, 07, 11 and 14 printed on a GPU machine (issue 25): ``make gpu-check`` runs the
# lessons there and writes the output of the cell above each ``gpu_run_output`` call into its report,
# one ``### <lesson>`` section under LESSONS_HEADING; a report committed as
# docs/gpu-check/<date>-<gpu>.md is what the lesson's cell shows. The ONE home of that format.
GPU_REPORTS = "docs/gpu-check"
LESSONS_HEADING = "## What the lessons printed on the GPU"
_FENCE = "````"  # four backticks: a lesson's output may hold a three-backtick fence
NO_GPU_RUN = ("no GPU run is recorded yet: `make gpu-check` on a machine with CUDA GPUs runs the lessons there, "
              f"and its report, committed in {GPU_REPORTS}/, shows here what this lesson printed")


def lesson_section(lesson: str, output: str) -> str:
    """The report's section for one lesson's GPU output (``lesson_outputs`` reads it back)."""
    return f"### {lesson}\n\n{_FENCE}text\n{output.rstrip()}\n{_FENCE}\n"


def lesson_outputs(report: str) -> dict[str, str]:
    """Lesson name -> its GPU output, from the sections under LESSONS_HEADING of a report's text."""
    _, found, lessons = report.partition(LESSONS_HEADING + "\n")
    if not found:
        return {}
    pattern = rf"^### (\S+)\n\n{_FENCE}text\n(.*?)\n?{_FENCE}$"
    return {m.group(1): m.group(2) for m in re.finditer(pattern, lessons, flags=re.M | re.S)}


def cell_text(cell: dict) -> str:
    """What a notebook cell printed: its streams, its result's text and its error (not the source
    listings, figures and other displays beside them)."""
    parts = []
    for out in cell.get("outputs", []):
        if out["output_type"] == "stream":
            parts.append("".join(out["text"]))
        elif out["output_type"] == "execute_result":
            parts.append("".join(out["data"].get("text/plain", "")) + "\n")
        elif out["output_type"] == "error":
            parts.append(f"{out['ename']}: {out['evalue']}\n")
    return "".join(parts)


def shown_on_gpu(notebook: dict) -> dict[str, str]:
    """Lesson -> the output of the code cell above each ``gpu_run_output("lesson")`` cell of an
    executed notebook (its JSON): what ``make gpu-check`` records for the lesson."""
    found, above = {}, None
    for cell in notebook["cells"]:
        if cell["cell_type"] != "code":
            continue
        source = "".join(cell["source"])
        for lesson in re.findall(r"gpu_run_output\(\s*[\"'](\w+)[\"']", source):
            if above is not None:
                found[lesson] = cell_text(above)
        above = cell
    return found


def latest_gpu_report(folder: str | None = None) -> Path | None:
    """The newest committed report (``<YYYY-MM-DD>-<gpu>.md``, the date first), or None."""
    import ddp_tutorial

    where = Path(folder) if folder else Path(ddp_tutorial.__file__).resolve().parent.parent / GPU_REPORTS
    reports = sorted(p for p in where.glob("*.md") if re.fullmatch(r"\d{4}-\d{2}-\d{2}-.+\.md", p.name))
    return reports[-1] if reports else None


def gpu_run_output(lesson: str, folder: str | None = None) -> None:
    """Print what the cell above this call printed on the GPU machine of the newest report.

    One stable line when no report is committed, so the stored output is the same everywhere.
    """
    report = latest_gpu_report(folder)
    if report is None:
        print(NO_GPU_RUN)
        return
    text = report.read_text()
    machine = text.splitlines()[0].lstrip("# ")
    output = lesson_outputs(text).get(lesson)
    if output is None:
        print(f"{GPU_REPORTS}/{report.name} ({machine}) has no output of {lesson}: see its table of results")
        return
    print(f"{GPU_REPORTS}/{report.name} ({machine}):\n{output}")
