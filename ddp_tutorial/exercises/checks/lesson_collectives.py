"""Lesson 05's exercises: ``scatter`` and ``all_gather`` from point-to-point messages."""

from __future__ import annotations

import torch

from ddp_tutorial.exercises.checks.lesson_point_to_point import POINT_TO_POINT_ONLY, token, whose
from ddp_tutorial.exercises.exercise import Exercise
from ddp_tutorial.exercises.harness import Case, Report, describe_tensor, load_function, run_cases, same_values
from ddp_tutorial.exercises.tracing import COLLECTIVES, original, traced

SHAPES = [((2,), torch.float32), ((2, 3), torch.int64), ((1,), torch.float64)]


def label(shape: tuple[int, ...], dtype: torch.dtype) -> str:
    return f"{tuple(shape)} {str(dtype).replace('torch.', '')}"


def scatter_p2p_worker(rank: int, world_size: int, source: str, function: str, trace_dir: str) -> Report:
    """Chunk i is token(i); rank r must end with what ``dist.scatter`` gives it."""
    with traced(rank, trace_dir, forbid=COLLECTIVES, reason=POINT_TO_POINT_ONLY) as trace:
        fn = load_function(source, function)

        def case(shape: tuple[int, ...], dtype: torch.dtype, src: int) -> str | None:
            chunks = [token(i, shape, dtype) for i in range(world_size)] if rank == src else None
            expected = torch.zeros_like(token(0, shape, dtype))  # on this rank's device
            original("scatter")(expected, [c.clone() for c in chunks] if chunks else None, src=src)
            out = torch.zeros_like(expected)
            got = fn(out, chunks, src)
            if got is not out:
                return f"it returned {describe_tensor(got)}, not the tensor out it was given (filled in place)"
            if chunks is not None and any(not same_values(c, token(i, shape, dtype)) for i, c in enumerate(chunks)):
                return "rank src changed its chunks: send them, leave them as they are"
            if not same_values(out, expected):
                holder = whose(out, world_size, shape, dtype)
                held = ("its initial zeros: nothing was received into out" if not out.any() else
                        f"chunk {holder}" if holder is not None else describe_tensor(out))
                return (f"out holds {held}, but should hold chunk {rank} {describe_tensor(expected)} "
                        f"(sent by rank {src})")
            return None

        cases: list[Case] = [(f"src {src}, chunks {label(shape, dtype)}",
                              lambda s=shape, d=dtype, src=src: case(s, d, src))
                             for src in sorted({0, world_size - 1}) for shape, dtype in SHAPES]
        return run_cases(trace, cases)


def all_gather_p2p_worker(rank: int, world_size: int, source: str, function: str, trace_dir: str) -> Report:
    """Rank r's tensor is token(r); the result must equal ``dist.all_gather``'s."""
    with traced(rank, trace_dir, forbid=COLLECTIVES, reason=POINT_TO_POINT_ONLY) as trace:
        fn = load_function(source, function)

        def case(shape: tuple[int, ...], dtype: torch.dtype) -> str | None:
            mine = token(rank, shape, dtype)
            expected = [torch.empty_like(mine) for _ in range(world_size)]
            original("all_gather")(expected, mine.clone())
            got = fn(mine)
            if not same_values(mine, token(rank, shape, dtype)):
                return "it changed the tensor it was given: leave it as it is"
            if not isinstance(got, (list, tuple)) or len(got) != world_size:
                size = f"a list of {len(got)}" if isinstance(got, (list, tuple)) else describe_tensor(got)
                return f"it returned {size}, not a list of world_size = {world_size} tensors"
            for i, (entry, want) in enumerate(zip(got, expected)):
                if not same_values(entry, want):
                    holder = whose(entry, world_size, shape, dtype) if isinstance(entry, torch.Tensor) else None
                    held = f"rank {holder}'s tensor" if holder is not None else describe_tensor(entry)
                    return (f"entry {i} holds {held}, but should hold rank {i}'s tensor {describe_tensor(want)}"
                            " (entry i comes from rank i)")
            return None

        cases: list[Case] = [(label(shape, dtype), lambda s=shape, d=dtype: case(s, d)) for shape, dtype in SHAPES]
        return run_cases(trace, cases)


EXERCISES = [
    Exercise(
        name="scatter_p2p", number="5.1", lesson=5, notebook="05_collectives.ipynb",
        title="scatter from send and recv", level="warm-up",
        task="Rebuild dist.scatter: rank src hands chunk i to rank i, using only send and recv.",
        hint=("if rank == src: dist.send(chunks[i], dst=i) for every other i, and out.copy_(chunks[src]); "
              "else: dist.recv(out, src=src). Return out."),
        checks=("src 0 and src world_size - 1; chunks of shapes (2,), (2, 3) and (1,) in float32, int64 "
                "and float64; out compared with what dist.scatter gives; out returned; src's chunks left "
                "unchanged; collectives refused"),
        worker=scatter_p2p_worker),
    Exercise(
        name="all_gather_p2p", number="5.2", lesson=5, notebook="05_collectives.ipynb",
        title="all_gather from isend and irecv", level="medium",
        task="Rebuild dist.all_gather: every rank ends with the list of all ranks' tensors, in rank order.",
        hint=("Copy your own into entry rank; for every other peer post dist.isend(tensor, dst=peer) and "
              "dist.irecv(entry[peer], src=peer); wait on all of them at the end."),
        checks=("tensors of shapes (2,), (2, 3) and (1,) in float32, int64 and float64; every entry "
                "compared with what dist.all_gather gives; the input left unchanged; collectives refused"),
        worker=all_gather_p2p_worker),
]
