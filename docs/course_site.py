"""The Sphinx extension behind `make site`: assembles the sources and adds each lesson's run commands.

Used by ``docs/conf.py``. At ``config-inited`` it fills the source folder (build/site-src) with
the pages of docs/, a copy of every ``notebooks/NN_*.ipynb`` under ``lessons/`` (its collapsed cells hidden), the API pages
(one per sub-package, autodoc on the imported modules) and the exercise and benchmark tables
(``{{ exercises_table }}`` and ``{{ bench_tables }}`` in docs/*.md, from the registry and
notebooks/data/bench_run.json). A file is rewritten only when its text changes, so Sphinx
rebuilds only what changed. Every lesson page gets a "Run this lesson" box (``lessons.py``).
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import pkgutil
import re
import shutil
from pathlib import Path

import lessons
from docutils import nodes
from sphinx.application import Sphinx
from sphinx.util import logging

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
NOTEBOOKS = ROOT / "notebooks"
logger = logging.getLogger(__name__)

# API pages: (page, title, modules under it), in course order: the shared top level, then one page
# per part. The exercises' solutions and generated stubs are left out: the lessons show each
# solution in its collapsed walkthrough, after the learner tried.
API_GROUPS = (
    ("shared", "Shared by every lesson: ddp_tutorial, env, models, ...", "ddp_tutorial"),  # what no part claims
    ("launch", "Starting processes: ddp_tutorial.launch", "ddp_tutorial.launch"),
    ("comm", "Communication (00, 02-06): ddp_tutorial.comm", "ddp_tutorial.comm"),
    ("data_parallel", "Data parallelism (01, 07, 08): ddp_tutorial.data_parallel", "ddp_tutorial.data_parallel"),
    ("training", "Training (11): ddp_tutorial.training", "ddp_tutorial.training"),
    ("cluster", "To the cluster (09, 16): ddp_tutorial.cluster", "ddp_tutorial.cluster"),
    ("pipeline_parallel", "Pipeline parallelism (10, 19): ddp_tutorial.pipeline_parallel",
     "ddp_tutorial.pipeline_parallel"),
    ("sharding", "Sharding and memory (14, 17, 18): ddp_tutorial.sharding", "ddp_tutorial.sharding"),
    ("tensor_parallel", "Tensor parallelism (15, 20): ddp_tutorial.tensor_parallel", "ddp_tutorial.tensor_parallel"),
    ("context_parallel", "Context parallelism (20): ddp_tutorial.context_parallel", "ddp_tutorial.context_parallel"),
    ("expert_parallel", "Expert parallelism (21): ddp_tutorial.expert_parallel", "ddp_tutorial.expert_parallel"),
    ("capstone", "The capstone (22): ddp_tutorial.capstone", "ddp_tutorial.capstone"),
    ("performance", "How fast, and why (23): ddp_tutorial.performance", "ddp_tutorial.performance"),
    ("pitfalls", "The debugging lab (12): ddp_tutorial.pitfalls", "ddp_tutorial.pitfalls"),
    ("bench", "Benchmarks (13): ddp_tutorial.bench", "ddp_tutorial.bench"),
    ("exercises", "Exercises: ddp_tutorial.exercises", "ddp_tutorial.exercises"),
    ("plots", "Figures: ddp_tutorial.plots", "ddp_tutorial.plots"),
)
# A part still to be written (the LLM-scale ladder lands one part at a time) has no page yet.
API_GROUPS = tuple(g for g in API_GROUPS if importlib.util.find_spec(g[2]) is not None)
LIST_ITEM = re.compile(r"^([-*]|\d+\.) ")
LITERAL = re.compile(r"(``[^`]+``)(\w?)")  # an inline literal, and a letter glued to its end
API_SKIP = ("ddp_tutorial.exercises.solutions", "ddp_tutorial.exercises.stubs")


def write_if_changed(path: Path, text: str) -> None:
    if not path.exists() or path.read_text() != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def site_notebook(path: Path) -> str:
    """A lesson as the site shows it: a cell JupyterLab keeps collapsed (an exercise's solution, after
    its walkthrough) is tagged ``hide-cell``, so the page shows it only when the reader opens it."""
    notebook = json.loads(path.read_text())
    for cell in notebook["cells"]:
        if cell.get("metadata", {}).get("jupyter", {}).get("source_hidden"):
            tags = cell["metadata"].setdefault("tags", [])
            if "hide-cell" not in tags:
                tags.append("hide-cell")
    return json.dumps(notebook, indent=1, ensure_ascii=False) + "\n"


def api_modules() -> list[str]:
    """Every module of ddp_tutorial that the API pages document, sorted."""
    import ddp_tutorial

    names = ["ddp_tutorial"] + [m.name for m in pkgutil.walk_packages(ddp_tutorial.__path__, "ddp_tutorial.")]
    return sorted(n for n in names if not n.endswith("__main__") and not n.startswith(API_SKIP))


def api_group(module: str) -> str:
    for page, _, prefix in API_GROUPS[1:]:
        if module == prefix or module.startswith(prefix + "."):
            return page
    return "shared"


def api_pages() -> dict[str, str]:
    """page name -> reStructuredText of the API reference."""
    modules = api_modules()
    pages = {}
    for page, title, _ in API_GROUPS:
        lines = [title, "=" * len(title), ""]
        for module in (m for m in modules if api_group(m) == page):
            # what a module defines, not what its __all__ re-exports: one entry per object
            lines += [f"``{module}``", "-" * (len(module) + 4), "", f".. automodule:: {module}",
                      "   :ignore-module-all:", ""]
        pages[page] = "\n".join(lines)
    index = ["API reference", "=============", "",
             "Generated from the docstrings of the installed ``ddp_tutorial`` package.", "",
             ".. toctree::", "   :maxdepth: 1", ""] + [f"   {page}" for page, _, _ in API_GROUPS]
    pages["index"] = "\n".join(index) + "\n"
    return pages


def exercises_table() -> str:
    """One Markdown section per exercise: number, name, level, lesson (linked), task, how to check it."""
    from ddp_tutorial.exercises.registry import EXERCISES

    out = []
    for e in EXERCISES.values():
        lesson = Path(e.notebook).stem
        out += [f"## {e.number} `{e.name}`: {e.title}", "",
                f"**{e.level}**, in [lesson {lesson[:2]}](lessons/{lesson}.ipynb). {e.task}", "",
                "```bash", f"python -m ddp_tutorial.exercises check {e.name}", "```", ""]
    return "\n".join(out)


def bench_tables() -> str:
    """Markdown tables of the stored reference run, formatted as `python -m ddp_tutorial.bench` prints them."""
    run = json.loads((NOTEBOOKS / "data" / "bench_run.json").read_text())
    machine = json.loads((NOTEBOOKS / "data" / "bench_machine.json").read_text())
    out = [f"Measured with `{machine['command']}` on {machine['cpus']} CPUs ({machine['machine']}, "
           f"{machine['cuda_devices']} GPUs), torch {machine['torch']}, Python {machine['python']}, "
           f"in {machine['seconds']} s.", ""]
    for result in run:
        command, _, what = result["name"].partition(": ")
        out += [f"## `bench {command}`", "", f"*{what}*" if what else "", "",
                "| " + " | ".join(result["columns"]) + " |",
                "|" + "---:|" * len(result["columns"])]
        for row in result["rows"]:
            cells = [f"{v:.4g}" if isinstance(v, float) else str(v) for v in (row.get(c, "") for c in result["columns"])]
            out.append("| " + " | ".join(cells) + " |")
        out.append("")
        out += [f"- **{key}: {value:.3g}**" for key, value in result["ratios"].items()]
        out += [f"- {note}" for note in result["notes"]] + [""]
    return "\n".join(out)


def assemble(app: Sphinx, config: object) -> None:
    """Fill app.srcdir with docs/*.md (tables filled in), the lessons and the API pages."""
    src = Path(app.srcdir)
    names = lessons.lesson_names(NOTEBOOKS)
    for page in DOCS.glob("*.md"):
        text = page.read_text()
        if "{{ exercises_table }}" in text:
            text = text.replace("{{ exercises_table }}", exercises_table())
        if "{{ bench_tables }}" in text:
            text = text.replace("{{ bench_tables }}", bench_tables())
        write_if_changed(src / page.name, text)
    for name in names:
        write_if_changed(src / "lessons" / f"{name}.ipynb", site_notebook(NOTEBOOKS / f"{name}.ipynb"))
    pages = api_pages()
    for page, text in pages.items():
        write_if_changed(src / "api" / f"{page}.rst", text)
    # a lesson or page that is gone must not linger in the site
    for stale in [p for p in (src / "lessons").glob("*.ipynb") if p.stem not in names] + \
                 [p for p in (src / "api").glob("*.rst") if p.stem not in pages]:
        stale.unlink()


def always_outdated(app: Sphinx, env: object, added: set, changed: set, removed: set) -> list[str]:
    # their tables come from Python and JSON that Sphinx does not watch
    return [doc for doc in ("exercises", "benchmarks") if doc in env.found_docs]


def add_run_box(app: Sphinx, doctree: nodes.document) -> None:
    """Insert "Run this lesson" (Jupyter, then the shell commands) after a lesson's introduction."""
    docname = app.env.docname
    if not docname.startswith("lessons/"):
        return
    lesson = docname.split("/", 1)[1]
    jupyter, shell = lessons.run_instructions(lesson)
    if not shell:
        logger.warning(f"lesson {lesson} has no shell commands: add it to docs/lessons.py COMMANDS",
                       location=docname)
    box = nodes.admonition(classes=["course-run", "tip"])
    box += nodes.title(text="Run this lesson")
    box += nodes.paragraph(text="In Jupyter, from a clone of the repository:")
    box += nodes.literal_block(jupyter, jupyter, language="bash")
    if shell:
        box += nodes.paragraph(text="From a shell, the modules this lesson runs (on GPUs nothing changes):")
        box += nodes.literal_block(shell, shell, language="bash")
    # after the introduction: before the first code cell or subsection
    section = next(iter(doctree.findall(nodes.section)))
    first = next((i for i, child in enumerate(section.children)
                  if isinstance(child, nodes.section) or "cell" in child.get("classes", [])),
                 len(section.children))
    section.insert(first, box)


def plain_docstring_to_rst(app: Sphinx, what: str, name: str, obj: object, options: object,
                           lines: list[str]) -> None:
    """Read the package's plain-text docstrings as reStructuredText, in place.

    They are written for ``help()`` and a terminal (nanoGPT style): an indented block after a
    blank line is a command or a table, shown as code; a ``- item`` list may follow its
    paragraph directly. reStructuredText needs ``::`` and a blank line for those.
    """
    out: list[str] = []
    last_text = ""  # the last non-blank line written
    for line in lines:
        stripped = line.lstrip()
        indent = len(line) - len(stripped)
        last_indent = len(last_text) - len(last_text.lstrip())
        starts_block = (stripped and out and not out[-1].strip() and last_text and indent > last_indent
                        and not last_text.rstrip().endswith("::") and not stripped.startswith(">>>")
                        and not LIST_ITEM.match(last_text.lstrip()) and not last_text.lstrip().startswith(".."))
        if starts_block:
            out += ["::", ""]
        elif (LIST_ITEM.match(stripped) and out and out[-1].strip() and indent <= last_indent
              and not LIST_ITEM.match(last_text.lstrip())):
            out.append("")
        # ``Footprint``s: a literal glued to a letter needs an escaped space in reST
        out.append(LITERAL.sub(lambda m: m[1] + ("\\ " + m[2] if m[2] else ""), line))
        if stripped:
            last_text = line
    lines[:] = out


def copy_mathjax(app: Sphinx, exception: Exception | None) -> None:
    """MathJax from the jupyter-server-mathjax wheel into _static/mathjax: no page loads a CDN."""
    if exception is None and app.builder.format == "html":
        import jupyter_server_mathjax

        static = Path(jupyter_server_mathjax.__file__).parent / "static"
        shutil.copytree(static, Path(app.outdir) / "_static" / "mathjax", dirs_exist_ok=True)


def setup(app: Sphinx) -> dict:
    app.connect("config-inited", assemble)
    app.connect("env-get-outdated", always_outdated)
    app.connect("doctree-read", add_run_box)
    app.connect("build-finished", copy_mathjax)
    app.connect("autodoc-process-docstring", plain_docstring_to_rst)
    # what this extension adds to the pages depends on this file and lessons.py: when they
    # change, Sphinx reads every page again instead of keeping the old run boxes
    code = b"".join(p.read_bytes() for p in (Path(__file__), Path(lessons.__file__)))
    return {"parallel_read_safe": True, "parallel_write_safe": True,
            "env_version": int(hashlib.sha256(code).hexdigest()[:8], 16)}
