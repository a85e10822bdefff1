"""Lesson 09's exercise: a rank-0 atomic checkpoint, a barrier, and a ``map_location`` load.

In each rank the checker wraps ``torch.save``, ``torch.load``, ``os.replace`` and
``os.rename`` while the learner's function runs, and so sees who writes which file and
how each rank loads. Rank 0's ``torch.save`` is made slow (a slow disk), and an older
checkpoint already lies at ``path`` (a job that resumes), so a rank that does not wait at a
barrier, even one polling ``os.path.exists``, loads the stale file. What is compared: only
rank 0 writes, never to ``path`` itself but to another file in the same folder renamed onto
it; every rank loads with ``map_location`` and ``weights_only=True`` (or without it where
torch's default is already True) and gets back exactly ``state``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist

from ddp_tutorial.env import rank_device
from ddp_tutorial.exercises.exercise import Exercise
from ddp_tutorial.exercises.harness import Case, Report, load_function, run_cases
from ddp_tutorial.exercises.tracing import traced

SLOW_DISK = 1.0  # seconds rank 0's torch.save waits before writing
BARRIER = dist.barrier  # the checker's own, taken before any patching


def default_weights_only() -> bool:
    """True where ``torch.load`` without ``weights_only=`` already refuses code (torch 2.6 and later)."""
    default = getattr(torch.serialization, "_default_to_weights_only", None)
    try:
        return bool(default(None)) if default is not None else False
    except TypeError:  # another signature: do not guess
        return False


def stale_state() -> dict[str, Any]:
    """The older checkpoint that lies at ``path`` before the call: recognisable by its step."""
    return {"model": {"weight": torch.zeros(3, 4), "bias": torch.zeros(3)}, "step": -1, "name": "stale"}


def target_of(f: Any) -> str:
    """The file a torch.save/load call writes or reads: a path, or an open file's name."""
    name = getattr(f, "name", f)
    return os.path.abspath(os.fspath(name)) if isinstance(name, (str, os.PathLike)) else repr(f)


@contextmanager
def watched(rank: int, slow: float) -> Iterator[dict[str, list]]:
    """Record torch.save / torch.load / os.replace / os.rename calls; make rank 0's saves slow."""
    seen: dict[str, list] = {"save": [], "load": [], "rename": []}
    save, load, replace, rename = torch.save, torch.load, os.replace, os.rename

    def slow_save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> Any:
        seen["save"].append(target_of(f))
        if rank == 0:
            time.sleep(slow)
        return save(obj, f, *args, **kwargs)

    def traced_load(f: Any, *args: Any, **kwargs: Any) -> Any:
        seen["load"].append((target_of(f), kwargs.get("map_location", args[0] if args else None),
                             kwargs.get("weights_only")))
        return load(f, *args, **kwargs)

    def renamer(original: Any) -> Any:
        def call(src: Any, dst: Any, *args: Any, **kwargs: Any) -> Any:
            seen["rename"].append((os.path.abspath(os.fspath(src)), os.path.abspath(os.fspath(dst))))
            return original(src, dst, *args, **kwargs)
        return call

    torch.save, torch.load, os.replace, os.rename = slow_save, traced_load, renamer(replace), renamer(rename)
    try:
        yield seen
    finally:
        torch.save, torch.load, os.replace, os.rename = save, load, replace, rename


def sample_state(case: int) -> dict[str, Any]:
    """A small state dict: weights, an optimizer-like number and a string."""
    g = torch.Generator().manual_seed(case)
    return {"model": {"weight": torch.randn(3, 4, generator=g), "bias": torch.randn(3, generator=g)},
            "step": 10 * case + 7, "name": f"case {case}"}


def same_state(got: Any, want: Any) -> bool:
    if isinstance(want, dict):
        return isinstance(got, dict) and got.keys() == want.keys() and all(same_state(got[k], want[k]) for k in want)
    if isinstance(want, torch.Tensor):
        return isinstance(got, torch.Tensor) and torch.equal(got.cpu(), want)
    return got == want


def tensors(x: Any) -> list[torch.Tensor]:
    if isinstance(x, dict):
        return [t for v in x.values() for t in tensors(v)]
    return [x] if isinstance(x, torch.Tensor) else []


def save_and_load_worker(rank: int, world_size: int, source: str, function: str, trace_dir: str) -> Report:
    """Two checkpoints, each to a fresh path; rank 0's save is slow, the others must wait for it."""
    device = rank_device()
    with traced(rank, trace_dir) as trace:
        fn = load_function(source, function)

        def case(number: int) -> str | None:
            path = os.path.abspath(os.path.join(trace_dir, f"checkpoint{number}.pt"))
            state = sample_state(number)
            if rank == 0:  # last run's checkpoint: what a resumed job finds
                torch.save(stale_state(), path)
            if dist.is_initialized():
                BARRIER()
            with watched(rank, SLOW_DISK) as seen:
                try:
                    loaded = fn(rank, world_size, state, path, device)
                except FileNotFoundError as err:
                    if rank != 0:
                        return (f"rank {rank} tried to load {os.path.basename(path)} before rank 0 had written "
                                f"it ({type(err).__name__}): a missing barrier? Rank 0 is slow to write here "
                                "(a slow disk); every rank must wait at dist.barrier() after rank 0's save "
                                "and before its own load")
                    raise
            if rank != 0 and seen["save"]:
                return (f"rank {rank} wrote a checkpoint too ({len(seen['save'])} torch.save call(s)): only rank 0 "
                        "writes (if rank == 0: ...); every rank holds the same weights, and two writers to one "
                        "file can interleave their bytes")
            if rank == 0:
                if not seen["save"]:
                    return "rank 0 never called torch.save: rank 0 writes the checkpoint"
                if path in seen["save"]:
                    return ("rank 0 wrote straight to the checkpoint's path, so a crash mid-write leaves a "
                            "truncated file there, not atomic: torch.save to a temporary file in the same "
                            "folder, then os.replace(tmp, path)")
                renamed = [src for src, dst in seen["rename"] if dst == path]
                if not renamed:
                    return ("rank 0 wrote another file but never renamed it onto the checkpoint's path: "
                            "os.replace(tmp, path) after torch.save(state, tmp)")
                if os.path.dirname(renamed[-1]) != os.path.dirname(path):
                    return ("rank 0 wrote its temporary file in another folder and renamed it onto the "
                            "checkpoint's path: a rename is atomic only within one file system, and /tmp is "
                            "often another one (os.replace then fails with EXDEV; a move that copies is not "
                            "atomic). Write the temporary file in the checkpoint's own folder")
            loads = [entry for entry in seen["load"] if entry[0] == path]
            if not loads:
                return f"rank {rank} did not load {os.path.basename(path)} with torch.load: every rank loads it"
            _, map_location, weights_only = loads[-1]
            if map_location is None:
                return (f"rank {rank} loaded without map_location: the tensors land on the device they were "
                        "saved from (cuda:0 for every rank on GPUs); pass map_location=device")
            if weights_only is not True and not (weights_only is None and default_weights_only()):
                return (f"rank {rank} loaded without weights_only=True: a checkpoint is a pickle and can run "
                        "code when loaded; weights_only=True accepts only tensors and plain data")
            if same_state(loaded, stale_state()):
                return (f"rank {rank} loaded the older checkpoint that was at {os.path.basename(path)} before rank "
                        "0's save had replaced it: it did not wait for rank 0 (polling os.path.exists sees the "
                        "old file at once). Every rank must wait at dist.barrier() after rank 0's save and "
                        "before its own load")
            if not same_state(loaded, state):
                return f"rank {rank} returned {type(loaded).__name__}, not the state that was saved (a state dict)"
            wrong = [t.device for t in tensors(loaded) if t.device != device]
            if wrong:
                return f"rank {rank}'s loaded tensors are on {wrong[0]}, not on its own device {device}"
            return None

        cases: list[Case] = [(f"checkpoint {n}, rank 0 slow to write", lambda n=n: case(n)) for n in (1, 2)]
        return run_cases(trace, cases)


EXERCISES = [
    Exercise(
        name="save_and_load", number="9.1", lesson=9, notebook="09_torchrun.ipynb",
        title="rank 0's atomic checkpoint, a barrier, a map_location load", level="medium",
        task=("Rank 0 saves the state atomically (a temporary file, then os.replace onto path), every rank "
              "waits at a barrier, then every rank loads the file onto its own device with weights_only=True "
              "and returns it."),
        hint=("if rank == 0: torch.save(state, tmp); os.replace(tmp, path). Then dist.barrier() on every "
              "rank, then torch.load(path, map_location=device, weights_only=True). checkpoint."
              "save_checkpoint does it with a temporary file of its own in path's folder."),
        checks=("two checkpoints, rank 0 made slow to write, an older checkpoint already at path; who calls "
                "torch.save (only rank 0), where to (never path itself: a file in the same folder renamed "
                "onto it), whether a rank loads before rank 0's save is in place (no barrier: the old file, "
                "or none), torch.load's map_location and weights_only (or torch's default, where it is "
                "True), and the loaded state, compared with what was saved, on the rank's device"),
        worker=save_and_load_worker,
        hang_hint=("a barrier that not every rank reaches: call dist.barrier() on every rank, outside "
                   "the if rank == 0 block")),
]
