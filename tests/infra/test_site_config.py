"""The website's pure parts (docs/lessons.py, the docstring reader): no Sphinx build needed."""
from __future__ import annotations

import importlib
import importlib.util
import inspect
import io
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "docs"))
import lessons  # noqa: E402  (docs/lessons.py)


def test_every_lesson_has_run_commands():
    names = lessons.lesson_names(ROOT / "notebooks")
    assert names[:2] == ["00_start_here", "01_data_parallel"] and len(names) >= 15
    assert not set(names) - set(lessons.COMMANDS), "lessons without commands in docs/lessons.py COMMANDS"
    # an entry may come before its notebook (16_cluster did); a typo would leave a lesson without one
    assert all(lessons.LESSON_NAME.match(name) for name in lessons.COMMANDS)


@pytest.mark.parametrize("command", sorted({c for cs in lessons.COMMANDS.values() for c in cs},
                                           key=lambda c: c.line()), ids=lambda c: c.line())
def test_every_command_runs_a_real_module(command):
    """`python -m X` / `torchrun -m X` needs X to be a module with a main() it calls, or a package with __main__."""
    if importlib.util.find_spec(command.dotted).submodule_search_locations is not None:
        assert importlib.util.find_spec(f"{command.dotted}.__main__"), f"{command.dotted} has no __main__"
        return
    module = importlib.import_module(command.dotted)
    assert callable(getattr(module, "main", None)), f"{command.dotted} has no main()"
    assert 'if __name__ == "__main__":' in inspect.getsource(module), f"{command.dotted} never calls main()"


def test_command_lines():
    hello, doctor = lessons.COMMANDS["00_start_here"]
    assert hello.lines() == ["# the first all-reduce", (
        "torchrun --master-addr=127.0.0.1 --master-port=29500 --nproc-per-node=2 -m ddp_tutorial.comm.hello")]
    assert doctor.line() == "python -m ddp_tutorial"
    jupyter, shell = lessons.run_instructions("14_sharding")
    assert "jupyter lab notebooks/14_sharding.ipynb" in jupyter
    assert shell.splitlines()[1:] == [
        "torchrun --master-addr=127.0.0.1 --master-port=29500 --nproc-per-node=2 -m ddp_tutorial.sharding.zero",
        "torchrun --master-addr=127.0.0.1 --master-port=29500 --nproc-per-node=2 -m ddp_tutorial.sharding.fsdp"]
    assert lessons.run_instructions("99_not_a_lesson")[1] == ""
    # every torchrun line of every lesson page: one node on loopback, never --standalone (lesson 09)
    for commands in lessons.COMMANDS.values():
        for command in commands:
            if command.nproc is not None:
                assert command.line().startswith(
                    "torchrun --master-addr=127.0.0.1 --master-port=29500 --nproc-per-node="), command
                assert "--standalone" not in command.line(), command


def rst_problems(lines: list[str]) -> str:
    """What docutils warns about when it reads ``lines`` ("" when nothing)."""
    import docutils.core

    stream = io.StringIO()
    docutils.core.publish_doctree("\n".join(lines), settings_overrides={
        "report_level": 2, "halt_level": 5, "warning_stream": stream})
    return stream.getvalue()


def test_plain_docstrings_read_as_restructuredtext():
    pytest.importorskip("sphinx")
    import course_site
    import docutils.core

    text = ("Runs a thing. From a shell:\n\n    torchrun --nproc-per-node=2 -m x \\\n"
            "        --more-args   # continued\n    python -m x\n\nThree reasons:\n- one\n  two\n"
            "- three\n\nIt returns ``Footprint``s.\n")
    lines = text.splitlines()
    course_site.plain_docstring_to_rst(None, "module", "x", None, None, lines)
    assert lines[2:4] == ["::", ""] and "``Footprint``\\ s." in lines[-1]
    assert rst_problems(text.splitlines()), "the raw docstring should upset docutils"
    assert not rst_problems(lines)
    doctree = docutils.core.publish_doctree("\n".join(lines))
    assert [b.astext().splitlines()[0] for b in doctree.findall(docutils.nodes.literal_block)] == [
        "torchrun --nproc-per-node=2 -m x \\"]
    assert len(list(doctree.findall(docutils.nodes.bullet_list))) == 1
    # untouched: a doctest, and a block that already has its ::
    kept = [">>> spawn(f, 2)", "[1.0, 1.0]", "", "Example::", "", "    code"]
    same = list(kept)
    course_site.plain_docstring_to_rst(None, "module", "x", None, None, same)
    assert same == kept


def test_benchmark_commands_name_real_subcommands():
    from ddp_tutorial.bench import SUBCOMMANDS

    shown = [c.args.split()[0] for cs in lessons.COMMANDS.values() for c in cs if c.module == "bench"]
    assert shown and set(shown) <= set(SUBCOMMANDS) | {"all"}, shown


def test_the_site_hides_what_jupyterlab_collapses():
    """Issue 37: a solution cell, collapsed in JupyterLab, is a closed "Show code cell content" on the site."""
    pytest.importorskip("sphinx")
    import course_site

    hidden = 0
    for name in lessons.lesson_names(ROOT / "notebooks"):
        path = ROOT / "notebooks" / f"{name}.ipynb"
        stored = json.loads(path.read_text())["cells"]
        shown = json.loads(course_site.site_notebook(path))["cells"]
        assert [c["source"] for c in shown] == [c["source"] for c in stored]
        for cell, site_cell in zip(stored, shown):
            collapsed = cell["metadata"].get("jupyter", {}).get("source_hidden", False)
            assert ("hide-cell" in site_cell["metadata"].get("tags", [])) == collapsed, "".join(cell["source"])[:80]
            hidden += collapsed
    assert hidden >= 20
