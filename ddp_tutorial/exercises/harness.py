"""The rank side of a check: import the learner's file afresh, run the cases in lock-step, report.

Every exercise's worker (in ``exercises.checks``) runs in each rank under
``launch.spawn``. It loads the learner's function with ``load_function`` (from the
file's current text: an edit counts at once, no kernel restart, no stale bytecode),
then ``run_cases`` runs the cases one after another. After each case every rank says
whether it saw a problem, and all stop together at the first case that failed
anywhere: a rank that stopped alone would leave the others waiting for it.

The checker starts every rank through ``in_scratch``: the learner's code runs in a scratch
folder, and a rank the launcher stops at the timeout first writes its stack, from which
``stuck_at`` reads the learner's line it was on.
"""

from __future__ import annotations

import ast
import faulthandler
import functools
import itertools
import os
import re
import signal
import sys
import types
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ddp_tutorial.env import rank_device
from ddp_tutorial.exercises.import_guard import import_guard
from ddp_tutorial.exercises.tracing import NotAllowed, Trace, original

# (label, run): run() returns None when this rank's result is right, else what is wrong
Case = tuple[str, Callable[[], "str | None"]]
Report = dict[str, Any]

_loaded = itertools.count()
# Every exercise's answer is in the course: a learner's file that imports it checks nothing.
SOLUTIONS = "ddp_tutorial.exercises.solutions"


def imported_module(text: str, modules: Sequence[str]) -> str | None:
    """The first import in ``text`` of one of ``modules`` (or of a module inside one), else None.

    ``from ddp_tutorial.comm import ring`` counts as importing ``ddp_tutorial.comm.ring``.
    """
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            if any(name == m or name.startswith(m + ".") for m in modules):
                return name
    return None


def load_function(source: str, function: str, *, refuse: Sequence[str] = ()) -> Callable[..., Any]:
    """Execute the file ``source`` as a new module and return its ``function``.

    Compiled from the text on disk each time (no ``__pycache__``: a quick edit of
    the same size within a second would otherwise load the old bytecode). A file that
    imports the solutions, or one of the course modules in ``refuse`` (the exercise's own
    answer, e.g. ``ddp_tutorial.comm.ring`` for ``ring_all_reduce``), raises ``NotAllowed``; so does
    any other route to them while the file loads or the function runs (``import_guard``).
    """
    path = Path(source)
    text = path.read_text(encoding="utf-8")
    used = imported_module(text, (SOLUTIONS, *refuse))
    if used:
        raise NotAllowed(f"{path.name} imports {used}: the exercise is to write this yourself, "
                         f"not to call the course's own version")
    name = f"exercise_{path.stem}_{next(_loaded)}"
    module = types.ModuleType(name)
    module.__file__ = str(path)
    sys.modules[name] = module  # dataclasses and pickling look modules up by name
    refused = (SOLUTIONS, *refuse)
    with import_guard(refused):
        exec(compile(text, str(path), "exec"), module.__dict__)
    fn = getattr(module, function, None)
    if not callable(fn):
        raise AttributeError(f"{path.name} defines no function {function}() (the checker calls it by that name)")

    @functools.wraps(fn)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        with import_guard(refused):
            return fn(*args, **kwargs)

    return guarded


def in_scratch(rank: int, world_size: int, worker: Callable[..., Any], scratch: str, source: str, function: str,
               trace_dir: str, *extra: Any) -> Any:
    """Run an exercise's ``worker`` (``Exercise.worker``) the way the checker runs it in every rank.

    In the folder ``scratch`` (shared by the ranks, like one machine's working directory): a
    relative path in the learner's code lands there, never in the checkout. The launcher stops
    a rank still running at the timeout with SIGTERM; faulthandler then writes every thread's
    stack to ``trace_dir/rank<R>.stack`` (from its signal handler: it works inside a busy
    loop that never gives Python's own handlers a turn), and ``stuck_at`` reads it.
    """
    os.chdir(scratch)
    if hasattr(faulthandler, "register"):  # not on Windows
        stack = open(os.path.join(trace_dir, f"rank{rank}.stack"), "w")  # noqa: SIM115  (faulthandler keeps it)
        faulthandler.register(signal.SIGTERM, file=stack, all_threads=True, chain=True)
    return worker(rank, world_size, source, function, trace_dir, *extra)


# A frame in faulthandler's dump: '  File "/path/x.py", line 12 in name' (innermost first)
DUMPED_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)",? line (?P<line>\d+),? in ', re.MULTILINE)


def stuck_at(trace_dir: str, rank: int, source: str | os.PathLike) -> tuple[int, bool] | None:
    """Where ``rank`` was in the learner's file ``source`` when it was stopped: ``(line, own)``, or None.

    ``own`` is True when that line was running itself (a loop, a ``sleep``, an ``input()``),
    False when it had called into a library (a collective, say) that was still at work.
    """
    path = os.path.join(trace_dir, f"rank{rank}.stack")
    try:
        dump = open(path, encoding="utf-8", errors="replace").read()
    except OSError:
        return None
    for thread in dump.split("\n\n"):  # one block per thread
        frames = list(DUMPED_FRAME.finditer(thread))
        mine = [i for i, m in enumerate(frames) if os.path.abspath(m["file"]) == os.path.abspath(source)]
        if mine:
            return int(frames[mine[0]]["line"]), mine[0] == 0
    return None


def anyone_failed(failed: bool) -> bool:
    """True on every rank when some rank failed (the checker's own all-reduce, never the learner's)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return failed
    flag = torch.tensor([1.0 if failed else 0.0], device=rank_device())
    original("all_reduce")(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def run_cases(trace: Trace, cases: Sequence[Case]) -> Report:
    """Run ``cases`` in order; stop at the first that failed on any rank.

    Returns ``{"cases": how many ran, "case": label of the failed one or None,
    "problem": what this rank saw (None if it was right)}``.
    """
    for done, (label, run) in enumerate(cases, start=1):
        trace.case(label)
        problem = run()
        trace.log("= case done")
        if anyone_failed(problem is not None):
            return {"cases": done, "case": label, "problem": problem}
    return {"cases": len(cases), "case": None, "problem": None}


def returned_in_place(name: str, result: Any, tensor: torch.Tensor, expected: torch.Tensor) -> str | None:
    """For in-place exercises: what is wrong with returning ``result`` for ``tensor`` (None: fine)."""
    if result is tensor:
        return None
    if result is None:
        return f"{name} returned None: return the tensor it was given (reduced in place)"
    if isinstance(result, torch.Tensor) and torch.equal(result.cpu(), expected.cpu()):
        return (f"{name} returned a new tensor with the right values, but the tensor it was given must hold "
                "the result (in place, like dist.all_reduce): write into it and return it")
    return f"{name} returned a {type(result).__name__}, not the tensor it was given"


def same_values(got: Any, want: torch.Tensor) -> bool:
    """Same shape, dtype and values (a result that is not a tensor never is)."""
    return (isinstance(got, torch.Tensor) and got.shape == want.shape and got.dtype == want.dtype
            and torch.equal(got.cpu(), want.cpu()))


def describe_tensor(x: Any) -> str:
    """Short and exact: the first values of a tensor, or what else ``x`` is."""
    if not isinstance(x, torch.Tensor):
        return f"a {type(x).__name__}"
    flat = x.detach().reshape(-1).cpu()
    values = [int(v) if float(v).is_integer() else v for v in flat[:6].tolist()]
    return "[" + ", ".join(map(str, values)) + (", ...]" if flat.numel() > 6 else "]")
