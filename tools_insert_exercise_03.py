"""Insert exercise 3.1 (launch_ranks) into notebooks/03_start_methods.ipynb; run once, then delete this file.

    .venv/bin/python tools_insert_exercise_03.py [notebooks/03_start_methods.ipynb]

Puts five cells right before the cell whose source starts with ``## Summary`` (the pattern of
lesson 02's exercise 2.2: the task in markdown, ``show``, ``check``, the collapsed walkthrough,
the reference solution's source) and appends one exercise line to the summary's bullet list.
The cells come with the outputs nbval expects (computed here with DDP_TUTORIAL_EXERCISES_FRESH=1,
as ``make nbval`` runs them), so the notebook need not be executed again for them; executing it
again gives the same. Refuses to run twice (it looks for "Exercise 3.1").
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import io
import json
import os
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent
NOTEBOOK = ROOT / "notebooks" / "03_start_methods.ipynb"
NAME = "launch_ranks"

TASK = """### Exercise 3.1 (medium): start ranks with multiprocessing alone

Now write the launcher yourself, the one `launch.spawn` stands for: `launch_ranks(fn, world_size, args=(), timeout=60.0)` starts `world_size` processes with a start method that is safe with threads and CUDA (spawn or forkserver, never fork), runs `fn(rank, world_size, *args)` in each, and returns the results **by rank**. A child cannot return to its parent, so its result travels through a queue or a pipe; a rank that raises, or whose process exits with a non-zero code, must be reported by rank; and at the timeout every child is stopped and joined before `TimeoutError` is raised. Use `multiprocessing` only: `torch.multiprocessing.spawn` and `ddp_tutorial.launch` are refused.

Open `my_exercises/launch_ranks.py` (created on your first check), or write it from a cell with `%%writefile ../my_exercises/launch_ranks.py`; its docstring is the full contract. The card below gives the signature, a hint and what the checker tests; `show("launch_ranks", hint=2)` and `hint=3` go further."""

WALKTHROUGH = """<details><summary>Solution walkthrough (after your attempt)</summary>

The start method is asked for, never taken by default: `ctx = multiprocessing.get_context("spawn")`,
then `ctx.Process` and `ctx.Queue`, so the children are fresh interpreters on every platform and
Python (the default is fork on Linux up to Python 3.13, a copy of a parent that may hold CUDA or
other threads' locks). A spawned child imports what it runs by module and name, so the small
function each child runs, `run_rank`, is at the top level of the file: it calls `fn(rank,
world_size, *args)` and puts `(rank, True, result)` on the queue, or `(rank, False, traceback)` if
`fn` raised. The parent files each message under its rank and returns `[by_rank[r] for r in
range(world_size)]`: the ranks finish in any order (the checker makes the highest finish first),
the answer is by rank. It never waits blindly: `results.get(timeout=0.05)` in a loop, and when
nothing comes it looks at the children still owing a result, since one that died with
`os._exit(3)` sends nothing (`p.exitcode` is 3: raise naming that rank), and at the deadline it
raises `TimeoutError`. The clean-up is in `finally`, so it runs on success, failure and timeout
alike: `kill()` every child still alive, then `join()` every child, so none is left running or
unreaped.

The next cell (collapsed) shows the reference solution.

</details>"""

SUMMARY_LINE = ("- Exercise 3.1 (`launch_ranks`): start ranks with `multiprocessing` alone: an explicit spawn\n"
                "  context, results through a queue filed by rank, the failed rank named, every child stopped\n"
                "  and joined at the timeout.")

SOLUTION_CELL = f"""from ddp_tutorial.nbtools import show_source
from ddp_tutorial.exercises.solutions import {NAME} as solution

show_source(solution.run_rank, solution.{NAME})"""


def lines(text: str) -> list[str]:
    """A cell's source or a stream's text as nbformat stores it: lines with their newlines."""
    return text.splitlines(keepends=True)


def cell_id(text: str) -> str:
    return hashlib.sha1(f"exercise 3.1: {text}".encode()).hexdigest()[:8]


def markdown(text: str) -> dict:
    return {"cell_type": "markdown", "id": cell_id(text), "metadata": {}, "source": lines(text)}


def code(text: str, outputs: list, metadata: dict | None = None) -> dict:
    return {"cell_type": "code", "execution_count": None, "id": cell_id(text), "metadata": metadata or {},
            "outputs": outputs, "source": lines(text)}


def stream(text: str) -> list:
    return [{"name": "stdout", "output_type": "stream", "text": lines(text)}]


def outputs() -> tuple[list, list, list]:
    """What ``show``, ``check`` (on the fresh stub) and ``show_source`` print, as the notebook stores it."""
    os.environ.pop("DDP_TUTORIAL_EXERCISES_DIR", None)
    os.environ["DDP_TUTORIAL_EXERCISES_FRESH"] = "1"
    from ddp_tutorial.exercises import check, show
    from ddp_tutorial.exercises.solutions import launch_ranks as solution
    shown, checked = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(shown):
        show(NAME)
    with contextlib.redirect_stdout(checked):
        assert not check(NAME)
    assert checked.getvalue().startswith("TO DO exercise 3.1"), checked.getvalue()
    source = "\n\n".join(inspect.getsource(f).rstrip() for f in (solution.run_rank, solution.launch_ranks))
    markdown_source = f"```python\n{source}\n```"
    displayed = [{"data": {"text/markdown": lines(markdown_source),
                           "text/plain": ["<IPython.core.display.Markdown object>"]},
                  "metadata": {}, "output_type": "display_data"}]
    return stream(shown.getvalue()), stream(checked.getvalue()), displayed


def with_exercise_line(summary: list[str]) -> list[str]:
    """The summary cell's source with ``SUMMARY_LINE`` after its last bullet (and that bullet's continuation)."""
    text = lines("".join(summary))
    last = max(i for i, line in enumerate(text) if line.startswith("- "))
    end = last + 1
    while end < len(text) and text[end].startswith("  "):
        end += 1
    if not text[end - 1].endswith("\n"):
        text[end - 1] += "\n"
    return text[:end] + lines(SUMMARY_LINE + ("\n" if end < len(text) else "")) + text[end:]


def main() -> None:
    sys.path.insert(0, str(ROOT))
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else NOTEBOOK
    nb = json.loads(path.read_text(encoding="utf-8"))
    cells = nb["cells"]
    if any("Exercise 3.1" in "".join(c["source"]) for c in cells):
        sys.exit(f"{path} already has exercise 3.1: nothing done")
    at = [i for i, c in enumerate(cells) if "".join(c["source"]).startswith("## Summary")]
    if len(at) != 1:
        sys.exit(f"{path}: expected one cell starting with '## Summary', found {len(at)}")
    shown, checked, solution = outputs()
    hidden = {"collapsed": True, "jupyter": {"outputs_hidden": True, "source_hidden": True}}
    new = [markdown(TASK),
           code(f'from ddp_tutorial.exercises import check, show\n\nshow("{NAME}")', shown),
           code(f'passed = check("{NAME}")', checked),
           markdown(WALKTHROUGH),
           code(SOLUTION_CELL, solution, hidden)]
    ids = {c.get("id") for c in cells}
    assert not ids & {c["id"] for c in new}, "cell id clash"
    summary = cells[at[0]]
    summary["source"] = with_exercise_line(summary["source"])
    # nbval takes a code cell with outputs but no execution count for one never run: number them
    # after the last code cell before them, as running the notebook from the top would
    count = max([c.get("execution_count") or 0 for c in cells[:at[0]] if c["cell_type"] == "code"], default=0)
    for c in new:
        if c["cell_type"] == "code":
            count += 1
            c["execution_count"] = count
    cells[at[0]:at[0]] = new
    # as JupyterLab saves it (tests/infra/test_notebooks.py): nbformat.write's layout, a final newline
    path.write_text(nbformat.writes(nbformat.from_dict(nb), version=nbformat.NO_CONVERT) + "\n", encoding="utf-8")
    print(f"{path}: inserted {len(new)} cells before '## Summary' and one summary line")


if __name__ == "__main__":
    main()
