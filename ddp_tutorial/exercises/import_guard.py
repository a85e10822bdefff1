"""The import guard: while a learner's code runs, the course's own answers cannot be reached.

Used by ``harness.load_function`` for every exercise (issue 37). The static scan of the learner's
file sees ``import`` statements only; this guard also refuses, while it is active, the routes
that scan cannot see: ``importlib.import_module`` or ``__import__`` with a computed name, a
``from package import module`` of a refused module, a refused module already imported by the
checker (reached through its parent package's attribute), and the refused source files read by
path (``open``, ``runpy.run_path``, ``importlib.util.spec_from_file_location``; not ``linecache``,
which reads the line a warning or a traceback shows). Each raises
``NotAllowed`` with one line naming what was refused. What it cannot stop, and does not pretend
to: code that digs the module out of ``sys.modules`` or reads the file through ``linecache`` by hand.
"""

from __future__ import annotations

import builtins
import contextlib
import functools
import importlib
import importlib.util
import os
import sys
from collections.abc import Iterator, Sequence

from ddp_tutorial.exercises.tracing import NotAllowed

__all__ = ["import_guard", "refused_name"]

# The audit hook is process-wide and cannot be removed once added (sys.addaudithook), so one is
# added per process, the first time a guard starts, and reads the folders of the guard now active.
_ACTIVE: dict[str, tuple[str, ...]] = {}


def refused_name(name: str, refuse: Sequence[str]) -> str | None:
    """``name`` if it is one of ``refuse`` or inside one of them, else None."""
    return name if any(name == r or name.startswith(r + ".") for r in refuse) else None


def _refusal(what: str) -> NotAllowed:
    return NotAllowed(f"your code reached {what}: the exercise is to write this yourself, "
                      "not to call the course's own version")


def _audit(event: str, args: tuple) -> None:
    folders = _ACTIVE.get("folders")
    if not folders or event != "open" or not isinstance(args[0], (str, bytes, os.PathLike)):
        return
    frame = sys._getframe(1)
    for _ in range(8):  # a warning's or a traceback's source line, read by linecache, is no way in
        if frame is None or frame.f_globals.get("__name__") == "linecache":
            return
        frame = frame.f_back
    path = os.path.realpath(os.fsdecode(args[0]))
    if any(path == f or path.startswith(f + os.sep) or path == f + ".py" for f in folders):
        raise _refusal(f"the file {path}")


@functools.cache
def _source_paths(refuse: tuple[str, ...]) -> tuple[str, ...]:
    """Each refused module's folder (a package) or its file without ``.py`` (a module).

    Cached: the guard starts at every call of the learner's function (a checker calls it once per
    case and rank), and find_spec reads the disk each time; where a module lives does not change.
    """
    paths = []
    for name in refuse:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        if spec is None or not spec.origin:
            continue
        origin = os.path.realpath(spec.origin)
        paths.append(os.path.dirname(origin) if spec.submodule_search_locations else origin[:-3])
    return tuple(paths)


@contextlib.contextmanager
def import_guard(refuse: Sequence[str]) -> Iterator[None]:
    """While active, importing or reading any module of ``refuse`` (dotted names) raises ``NotAllowed``."""
    refuse = tuple(refuse)
    folders = _source_paths(refuse)  # found before the guard starts: find_spec itself reads the disk
    real_import, real_import_module, real_dunder = builtins.__import__, importlib.import_module, importlib.__import__

    def guarded_import(name, globals=None, locals=None, fromlist=(), level=0):  # noqa: A002  (__import__'s names)
        if level == 0:
            wanted = [name] + [f"{name}.{item}" for item in fromlist or () if item != "*"]
            hit = next((refused_name(n, refuse) for n in wanted if refused_name(n, refuse)), None)
            if hit:
                raise _refusal(hit)
        return real_import(name, globals, locals, fromlist, level)

    def guarded_import_module(name, package=None):
        hit = refused_name(importlib.util.resolve_name(name, package) if name.startswith(".") else name, refuse)
        if hit:
            raise _refusal(hit)
        return real_import_module(name, package)

    # a refused module already imported stays reachable as its parent's attribute: hidden meanwhile
    hidden = []
    for name in [n for n in sys.modules if refused_name(n, refuse)]:
        parent, _, child = name.rpartition(".")
        if parent in sys.modules and child in vars(sys.modules[parent]):
            hidden.append((sys.modules[parent], child, vars(sys.modules[parent]).pop(child)))
    if "hook" not in _ACTIVE:
        sys.addaudithook(_audit)
        _ACTIVE["hook"] = ()
    outer = _ACTIVE.get("folders", ())
    builtins.__import__ = importlib.__import__ = guarded_import
    importlib.import_module = guarded_import_module
    _ACTIVE["folders"] = outer + folders
    try:
        yield
    finally:
        builtins.__import__, importlib.import_module, importlib.__import__ = real_import, real_import_module, real_dunder
        _ACTIVE["folders"] = outer
        for parent, child, module in hidden:
            setattr(parent, child, module)
