"""Inside a checked rank: record the library calls the learner's code makes, with their arguments.

``tracing`` logs messages and collectives; some exercises are about *which* library
functions a solution calls (``torch.load`` or ``dcp.load``, ``set_model_state_dict`` or
nothing, with which ``StateDictOptions``). ``recording(trace, targets)`` replaces each
target, a module attribute such as ``torch.load``, by a wrapper that appends a
``LibraryCall`` (its bound arguments) and logs ``> name`` / ``< name`` lines to the rank's
trace, so a hang inside it is reported by ``tracing.where_stuck``. While a recorded call
runs, ``trace.depth`` is raised: the collectives and the ``torch.load`` calls the library
makes inside it are its own, not the learner's (``nested`` says so for recorded ones).
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from ddp_tutorial.exercises.tracing import Trace, original


@dataclass
class LibraryCall:
    """One call: ``name`` as the targets spell it, its arguments by parameter name."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    nested: bool = False  # made by another recorded call (DCP's own torch.load), not by the learner
    phase: str = ""


def wrapped(trace: Trace, calls: list[LibraryCall], name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` that records itself into ``calls`` and hides what it calls from ``tracing``."""
    try:
        signature: inspect.Signature | None = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin without a signature: arguments by position only
        signature = None

    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            arguments = dict(signature.bind(*args, **kwargs).arguments) if signature else dict(kwargs)
        except TypeError:  # a wrong call: let the function itself raise its own error
            arguments = dict(kwargs)
        calls.append(LibraryCall(name, arguments, nested=trace.depth > 0, phase=trace.phase))
        return trace.logged(f"{name} (call {len(calls)})", fn, *args, **kwargs)

    call.__name__ = call.__qualname__ = getattr(fn, "__name__", name)
    call.__doc__ = getattr(fn, "__doc__", None)
    return call


@contextmanager
def recording(trace: Trace, targets: Mapping[str, Sequence[str]]) -> Iterator[list[LibraryCall]]:
    """Record the calls to each target while the block runs; restore them after.

    ``targets`` maps a name to the ``"module:attribute"`` places that hold the same function
    (``{"dcp.load": ["torch.distributed.checkpoint:load",
    "torch.distributed.checkpoint.state_dict_loader:load"]}``): every spelling a learner's
    import may reach is patched, and all of them record under the one name.
    """
    calls: list[LibraryCall] = []
    replacements = []
    for name, places in targets.items():
        for place in places:
            module_name, attribute = place.split(":")
            module = importlib.import_module(module_name)
            replacements.append((module, attribute, wrapped(trace, calls, name, getattr(module, attribute))))
    with patched(replacements):
        yield calls


@contextmanager
def patched(replacements: Sequence[tuple[Any, str, Any]]) -> Iterator[None]:
    """Set each ``(module, attribute, replacement)`` while the block runs; restore the originals after."""
    saved = [(module, attribute, getattr(module, attribute)) for module, attribute, _ in replacements]
    for module, attribute, replacement in replacements:
        setattr(module, attribute, replacement)
    try:
        yield
    finally:
        for module, attribute, original in reversed(saved):
            setattr(module, attribute, original)


def learner_calls(calls: Sequence[LibraryCall], name: str) -> list[LibraryCall]:
    """The calls to ``name`` that the learner's code made itself (not from inside another recorded call)."""
    return [c for c in calls if c.name == name and not c.nested]


def checked_new_group(trace: Trace, world: int, real: Callable[..., Any]) -> Callable[..., Any]:
    """``new_group`` that first compares, across the ranks, the ranks each asked for.

    new_group is a collective of the whole world (unless ``use_local_synchronization``): a rank
    that skips a group it is not in, or makes them in another order, hangs or mixes groups up;
    this says so in one line instead (exercises 2.2 and 15.2).
    """
    def new_group(ranks: Any = None, *args: Any, **kwargs: Any) -> Any:
        if not kwargs.get("use_local_synchronization"):
            asked = sorted(int(r) for r in ranks) if ranks is not None else list(range(world))
            everyone: list = [None] * world
            trace.logged("new_group (compared)", original("all_gather_object"), everyone, asked)
            if any(other != asked for other in everyone):
                calls = ", ".join(f"rank {r} new_group({other})" for r, other in enumerate(everyone))
                raise RuntimeError(f"the ranks asked for different groups in the same new_group call ({calls}): "
                                   "every rank must call new_group for every group, in the same order, even for "
                                   "a group it is not in")
        return real(ranks, *args, **kwargs)
    return new_group
