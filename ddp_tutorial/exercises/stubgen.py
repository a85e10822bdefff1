"""Stubs made from the reference solutions: imports, signature and docstring kept, the body replaced.

The committed stubs in ``exercises/stubs/`` must equal what ``stub_source`` makes
(``tests/exercises/test_exercises.py`` checks it). After changing a solution or an exercise's
number or notebook, write them again:

    python -m ddp_tutorial.exercises.stubgen
"""

from __future__ import annotations

import ast
import textwrap

from ddp_tutorial.exercises.exercise import Exercise
from ddp_tutorial.exercises.registry import EXERCISES
from ddp_tutorial.exercises.workspace import STUBS_DIR, solution_file, stub_file

STUBS_INIT = '"""Made from ``exercises/solutions`` by ``python -m ddp_tutorial.exercises.stubgen``: do not edit."""\n'


def header(e: Exercise) -> str:
    """The stub's module docstring: which exercise, how to check it, how to start again."""
    return textwrap.dedent(f'''\
        """Exercise {e.number} ({e.level}), lesson {e.notebook}: {e.title}.

        Write {e.function}() below (its docstring is the contract: what must hold), then check it:
            check("{e.name}")                                 in the notebook
            python -m ddp_tutorial.exercises check {e.name}   from a shell
        The checker's ranks read this file afresh each time: an edit counts at once.
        {hints_line(e)}
        Start again from the stub: python -m ddp_tutorial.exercises reset {e.name}
        """
        ''')


def hints_line(e: Exercise) -> str:
    """Where the hints are: one, or graduated ones (``--hint 2`` and on)."""
    if len(e.hints) == 1:
        return f"A hint: python -m ddp_tutorial.exercises show {e.name}"
    return (f"Hints, one at a time: python -m ddp_tutorial.exercises show {e.name} [--hint 2 .. {len(e.hints)}]")


def not_implemented_line(e: Exercise, indent: str) -> str:
    """``raise NotImplementedError(...)``, the message split to fit lines of 100 characters."""
    parts = textwrap.wrap(e.not_implemented(), width=100 - len(indent) - 6, drop_whitespace=False)
    inner = f"\n{indent}    ".join(repr(p) for p in parts)
    return f"{indent}raise NotImplementedError(\n{indent}    {inner})\n"


def stub_source(e: Exercise) -> str:
    """The stub of ``e``, from its solution: header, the solution's imports, the function without its body."""
    source = solution_file(e.name).read_text(encoding="utf-8")
    lines = source.splitlines(keepends=True)
    tree = ast.parse(source)
    imports = [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))]
    functions = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == e.function]
    if len(functions) != 1:
        raise ValueError(f"{solution_file(e.name)} must define {e.function}() once at the top level")
    fn = functions[0]
    doc = fn.body[0]
    if not (isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant) and isinstance(doc.value.value, str)):
        raise ValueError(f"{e.function}() in {solution_file(e.name)} needs a docstring: it is the learner's task")
    out = [header(e), "\n"]
    for node in imports:
        if node.lineno > 1 and node is not imports[0] and lines[node.lineno - 2].strip() == "":
            out.append("\n")  # keep the blank lines between import groups
        out.extend(lines[node.lineno - 1:node.end_lineno])
    start = min([fn.lineno] + [d.lineno for d in fn.decorator_list])
    indent = " " * doc.col_offset
    out.extend(["\n", "\n"] + lines[start - 1:doc.end_lineno])
    out.append(f"{indent}# Your code here; the checker calls {e.call()} on every rank.\n")
    out.append(not_implemented_line(e, indent))
    return "".join(out)


def expected_stubs() -> dict[str, str]:
    """File name -> text, for every file ``exercises/stubs/`` must hold."""
    files = {stub_file(name).name: stub_source(e) for name, e in EXERCISES.items()}
    files["__init__.py"] = STUBS_INIT
    return files


def stale_stubs() -> list[str]:
    """The stub files that differ from what the generator makes, are missing, or should not be there."""
    want = expected_stubs()
    have = {p.name for p in STUBS_DIR.glob("*.py")}
    wrong = [name for name, text in want.items()
             if name not in have or (STUBS_DIR / name).read_text(encoding="utf-8") != text]
    return sorted(wrong + list(have - set(want)))


def write_stubs() -> list[str]:
    """Write every stub that is stale; return their names."""
    stale = stale_stubs()
    want = expected_stubs()
    for name in stale:
        path = STUBS_DIR / name
        if name in want:
            path.write_text(want[name], encoding="utf-8")
        else:
            path.unlink()
    return stale


def main() -> None:
    written = write_stubs()
    print(f"wrote {', '.join(written)}" if written else "every stub is up to date")


if __name__ == "__main__":
    main()
