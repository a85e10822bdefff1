"""Inside a checked rank: log every message the learner's code sends, refuse what it must not call.

``traced(rank, trace_dir, forbid=..., record=...)`` replaces ``send``, ``recv``, ``isend``
and ``irecv`` (in ``torch.distributed`` and in ``distributed_c10d``, so ``P2POp`` and
``batch_isend_irecv`` see them too) by wrappers that write each call to
``trace_dir/rank<R>.log`` before and after it runs. When a check times out, the parent
reads the last line of each stuck rank (``where_stuck``): ``> recv from rank 0 (#3)``
without its ``<`` line means the rank is blocked in that call. ``forbid`` names
collectives that raise ``NotAllowed``; ``record`` names collectives logged like messages.
The flat collectives under the course's names (``reduce_scatter_single``, ``all_gather_single``
in ``ddp_tutorial.comm.collectives``, torch's newer names) are patched there too, so a file
that imports them is seen. The checker's own references call ``original(name)``, never the
patched names. ``moves()`` records the device moves (``Tensor.to``/``cuda``/``cpu``) a
solution makes, and ``hook_registrations()`` which kind of tensor hook it registers.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from torch.overrides import TorchFunctionMode

from ddp_tutorial.comm import collectives as course

P2P = ("send", "recv", "isend", "irecv")
SENDS = ("send", "isend")
COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor",
               "broadcast", "scatter", "gather", "reduce", "all_to_all", "all_to_all_single",
               "all_gather_object", "broadcast_object_list", "scatter_object_list", "gather_object",
               "reduce_scatter_single", "all_gather_single")
# The flat forms' kinds: torch's old and new names, and the course's aliases of them.
REDUCE_SCATTERS = ("reduce_scatter", "reduce_scatter_tensor", "reduce_scatter_single")
ALL_GATHERS = ("all_gather", "all_gather_into_tensor", "all_gather_single")
# Taken when this module is imported, before any patching; the course's names where torch has none.
ORIGINALS = {name: getattr(c10d, name, None) or getattr(course, name, None) for name in P2P + COLLECTIVES}
ORIGINALS = {name: fn for name, fn in ORIGINALS.items() if fn is not None}


class NotAllowed(RuntimeError):
    """The learner's code called a collective that this exercise builds by hand."""


def original(name: str) -> Callable[..., Any]:
    """torch's own ``dist.<name>``, whatever is patched: for the checker's references."""
    return ORIGINALS[name]


@dataclass
class Call:
    kind: str  # "send", "irecv", "all_reduce", ...
    peer: int | None  # the other rank of a message
    numel: int
    phase: str  # what the checker was doing: "backward", "after backward", ...
    async_op: bool


class Trace:
    """This rank's log file and the calls of the current case."""

    def __init__(self, rank: int, trace_dir: str):
        self.file = open(os.path.join(trace_dir, f"rank{rank}.log"), "w", buffering=1)  # line by line
        self.calls: list[Call] = []
        self.phase = ""
        self.depth = 0  # > 0 inside a traced call: send calls isend, which is not a second message
        self.on_send: Callable[[], None] | None = None  # called before each send: a checker's snapshot

    def case(self, label: str) -> None:
        self.calls = []
        self.log(f"case {label}")

    def log(self, line: str) -> None:
        self.file.write(line + "\n")

    def logged(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` between ``> what`` and ``< what``; what it calls inside is not traced again."""
        self.log(f"> {what}")
        self.depth += 1
        try:
            result = fn(*args, **kwargs)
        finally:
            self.depth -= 1
        self.log(f"< {what}")  # not reached when fn raises: the log then shows where the rank was
        return result

    def close(self) -> None:
        self.file.close()


class TracedWork:
    """A work handle whose ``wait()`` is logged; everything else is the real handle's."""

    def __init__(self, work: Any, trace: Trace, what: str):
        self.work, self.trace, self.what = work, trace, what

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        self.trace.log(f"> wait for {self.what}")
        result = self.work.wait(*args, **kwargs)
        self.trace.log(f"< wait for {self.what}")
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self.work, name)


def _wrap(trace: Trace, name: str, refuse: str | None) -> Callable[..., Any]:
    fn = ORIGINALS[name]
    signature = inspect.signature(fn)

    def call(*args: Any, **kwargs: Any) -> Any:
        if trace.depth:
            return fn(*args, **kwargs)
        if refuse is not None:
            raise NotAllowed(f"dist.{name} is not allowed in this exercise: {refuse}")
        bound = signature.bind(*args, **kwargs).arguments
        tensor = bound.get("tensor", args[0] if args else None)
        peer = next((bound[k] for k in ("dst", "src", "group_dst", "group_src") if bound.get(k) is not None), None)
        trace.calls.append(Call(name, peer, getattr(tensor, "numel", lambda: 0)(), trace.phase,
                                name in ("isend", "irecv") or bool(bound.get("async_op"))))
        if name in SENDS and trace.on_send is not None:
            trace.on_send()
        what = f"{name} {'to' if name in SENDS else 'from'} rank {peer}" if name in P2P else f"dist.{name}"
        what += f" (#{len(trace.calls)})"
        result = trace.logged(what, fn, *args, **kwargs)
        return TracedWork(result, trace, what) if result is not None and hasattr(result, "wait") else result

    call.__name__ = call.__qualname__ = name
    return call


@contextmanager
def traced(rank: int, trace_dir: str, forbid: Sequence[str] = (), reason: str = "",
           record: Sequence[str] = ()) -> Iterator[Trace]:
    """Patch the messages (and ``forbid``/``record`` collectives) for the learner's code; undo after."""
    trace = Trace(rank, trace_dir)
    patches = {name: _wrap(trace, name, None) for name in P2P + tuple(record)}
    patches.update({name: _wrap(trace, name, reason) for name in forbid if name in ORIGINALS})
    saved = [(module, name, getattr(module, name)) for module in (dist, c10d, course) for name in patches
             if hasattr(module, name) and (module is not course or name in ("reduce_scatter_single", "all_gather_single"))]
    for module, name, _ in saved:
        setattr(module, name, patches[name])
    try:
        yield trace
    finally:
        for module, name, fn in saved:
            setattr(module, name, fn)
        trace.close()


def where_stuck(trace_dir: str, rank: int) -> tuple[str, str]:
    """``(case, what)`` from a rank's log: the case it was in and the call it is blocked in ("" if none)."""
    path = os.path.join(trace_dir, f"rank{rank}.log")
    lines = open(path).read().splitlines() if os.path.exists(path) else []
    case, last = "", ""
    for line in lines:
        if line.startswith("case "):
            case, last = line[len("case "):], ""
        else:
            last = line
    if last.startswith("> "):
        return case, f"stuck in {last[2:]}"
    if last == "= case done":
        return case, "done with the case, waiting for the others to finish it"
    return case, ""


def last_call(trace_dir: str, rank: int) -> str:
    """The last traced call a rank began in its current case, e.g. ``"irecv from rank 0 (#2)"`` ("" if none).

    A rank gloo aborts may die between two log lines: after ``irecv`` returned but before its
    ``wait()``, so ``where_stuck`` alone cannot say which message killed it.
    """
    path = os.path.join(trace_dir, f"rank{rank}.log")
    lines = open(path).read().splitlines() if os.path.exists(path) else []
    for line in reversed(lines):
        if line.startswith("case "):
            return ""
        if line.startswith(("> ", "< ")):
            return line[2:].removeprefix("wait for ")
    return ""


@dataclass
class Move:
    source: int  # id() of the tensor moved
    result: int  # id() of the tensor returned (the same one when it already was there)
    device: torch.device | None  # where it was asked to go (None: a dtype-only .to)


def _target(method: str, args: tuple, kwargs: dict) -> torch.device | None:
    """The device a ``Tensor.to``/``cuda``/``cpu`` call asks for, as written (``"cpu:1"`` keeps its index)."""
    if method == "cpu":
        return torch.device("cpu")
    if method == "cuda":
        index = kwargs.get("device", args[1] if len(args) > 1 else None)
        return torch.device("cuda" if index is None else index if not isinstance(index, int) else f"cuda:{index}")
    candidates = [kwargs.get("device")] + list(args[1:])
    for a in candidates:
        if isinstance(a, (str, torch.device)):
            return torch.device(a)
        if isinstance(a, torch.Tensor):
            return a.device
    return None


class MoveRecorder(TorchFunctionMode):
    """Every ``Tensor.to``, ``.cuda()`` and ``.cpu()`` while active: which tensor, asked to go where."""

    METHODS = {torch.Tensor.to: "to", torch.Tensor.cuda: "cuda", torch.Tensor.cpu: "cpu"}

    def __init__(self) -> None:
        super().__init__()
        self.moves: list[Move] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001  (torch's protocol)
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        method = self.METHODS.get(func)
        if method and args and isinstance(args[0], torch.Tensor):
            self.moves.append(Move(id(args[0]), id(result), _target(method, args, kwargs)))
        return result

    def moved(self, tensor: torch.Tensor, device: str | torch.device) -> bool:
        """True when ``tensor`` came out of a move asked for ``device`` (already there counts: ``to`` returns it)."""
        want = torch.device(device)
        return any(m.device == want and m.result == id(tensor) for m in self.moves)

    def sent(self, tensors: Sequence[torch.Tensor], device: str | torch.device) -> bool:
        """True when each of ``tensors`` went into a move asked for ``device`` (a module's ``.to`` moves each)."""
        sources = {m.source for m in self.moves if m.device == torch.device(device)}
        return bool(tensors) and all(id(t) in sources for t in tensors)


@contextmanager
def moves() -> Iterator[MoveRecorder]:
    """Record the device moves made inside the block (``MoveRecorder``)."""
    with MoveRecorder() as recorder:
        yield recorder


@contextmanager
def hook_registrations() -> Iterator[list[tuple[str, int]]]:
    """Record ``(kind, id(tensor))`` for each ``register_hook``/``register_post_accumulate_grad_hook`` call."""
    seen: list[tuple[str, int]] = []
    saved = {kind: getattr(torch.Tensor, kind) for kind in ("register_hook", "register_post_accumulate_grad_hook")}

    def recorder(kind: str) -> Callable[..., Any]:
        def register(self: torch.Tensor, hook: Callable[..., Any]) -> Any:
            seen.append((kind, id(self)))
            return saved[kind](self, hook)
        return register

    for kind in saved:
        setattr(torch.Tensor, kind, recorder(kind))
    try:
        yield seen
    finally:
        for kind, fn in saved.items():
            setattr(torch.Tensor, kind, fn)
