"""Small helpers for the notebooks: show the code that runs, keep printed numbers stable."""

from __future__ import annotations

import inspect
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


def rounded(value: Any, digits: int = 4) -> Any:
    """Round floats (also inside lists, tuples, dicts and tensors) so outputs compare across machines."""
    if isinstance(value, float):
        return round(value, digits) + 0.0  # + 0.0 turns -0.0 into 0.0
    if isinstance(value, dict):
        return {k: rounded(v, digits) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(rounded(v, digits) for v in value)
    if hasattr(value, "tolist") and hasattr(value, "dtype"):
        return rounded(value.tolist(), digits)
    return value
