"""Small helpers for the notebooks: show the code that runs, keep printed numbers stable."""

from __future__ import annotations

import inspect
from collections.abc import Callable
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
    a stored output (and the website) must not publish the writer's paths (``15_cluster``).
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
