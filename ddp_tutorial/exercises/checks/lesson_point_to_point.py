"""Lesson 04's exercise: tokens hop around a ring, with ``isend``/``irecv`` and no deadlock."""

from __future__ import annotations

import torch

from ddp_tutorial.env import rank_device
from ddp_tutorial.exercises.exercise import Exercise
from ddp_tutorial.exercises.harness import Case, Report, describe_tensor, load_function, run_cases, same_values
from ddp_tutorial.exercises.tracing import COLLECTIVES, Trace, traced

POINT_TO_POINT_ONLY = "build it from point-to-point messages (send/recv, isend/irecv)"
SHAPES = [((3,), torch.float32), ((2, 3), torch.int64), ((1,), torch.float64)]


def token(rank: int, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """Rank r's token: 100 r + 1, 100 r + 2, ...: any element tells whose token it is."""
    numel = torch.Size(shape).numel()
    return (torch.arange(1, numel + 1) + 100 * rank).reshape(shape).to(dtype=dtype, device=rank_device())


def whose(x: torch.Tensor, world_size: int, shape: tuple[int, ...], dtype: torch.dtype) -> int | None:
    """The rank whose token ``x`` is, if it is one."""
    return next((r for r in range(world_size) if same_values(x, token(r, shape, dtype))), None)


def neighbours_only(trace: Trace, rank: int, world_size: int) -> str | None:
    """A ring passes messages to the right neighbour only, and takes them from the left one."""
    right, left = (rank + 1) % world_size, (rank - 1) % world_size
    for call in trace.calls:
        sending = call.kind in ("send", "isend")
        if call.peer != (right if sending else left):
            return (f"it called {call.kind} {'to' if sending else 'from'} rank {call.peer}: in a ring rank "
                    f"{rank} sends only to its right neighbour {right} and receives only from its left "
                    f"neighbour {left}, one hop at a time")
    return None


def ring_shift_worker(rank: int, world_size: int, source: str, function: str, trace_dir: str) -> Report:
    """Every shape, 0, 1, 2 and n + 1 hops; the result must be rank (r - hops)'s token."""
    with traced(rank, trace_dir, forbid=COLLECTIVES, reason=POINT_TO_POINT_ONLY) as trace:
        fn = load_function(source, function)

        def case(shape: tuple[int, ...], dtype: torch.dtype, hops: int) -> str | None:
            mine = token(rank, shape, dtype)
            got = fn(mine, hops)
            if not same_values(mine, token(rank, shape, dtype)):
                return "it changed the tensor it was given: leave it as it is and return a new one"
            want_rank = (rank - hops) % world_size
            if not same_values(got, token(want_rank, shape, dtype)):
                holder = whose(got, world_size, shape, dtype) if isinstance(got, torch.Tensor) else None
                held = (f"rank {holder}'s token" if holder is not None else describe_tensor(got))
                why = " (its own: nothing arrived, or it was not returned)" if holder == rank else ""
                return (f"after {hops} hop(s) it returned {held}{why}, but should hold rank {want_rank}'s "
                        f"token {describe_tensor(token(want_rank, shape, dtype))}: each hop sends to "
                        f"(rank + 1) % world_size and receives from (rank - 1) % world_size")
            return neighbours_only(trace, rank, world_size)

        cases: list[Case] = [(f"{hops} hop(s), {tuple(shape)} {str(dtype).replace('torch.', '')}",
                              lambda s=shape, d=dtype, h=hops: case(s, d, h))
                             for hops in (1, 2, 0, world_size + 1) for shape, dtype in SHAPES]
        return run_cases(trace, cases)


EXERCISES = [
    Exercise(
        name="ring_shift", number="4.1", lesson=4, notebook="04_point_to_point.ipynb",
        title="pass tokens around a ring without a deadlock", level="medium",
        task=("Every rank holds a token; move all the tokens hops places to the right around the ring at "
              "once, one hop at a time, so that rank r ends with rank (r - hops)'s token."),
        hint=("Per hop: works = [dist.isend(held, dst=right), dist.irecv(arriving, src=left)], then wait "
              "on both; the tensor that arrived is the one you send next. A world of one: return a copy."),
        checks=("tokens of shapes (3,), (2, 3) and (1,) in float32, int64 and float64; 0, 1, 2 and "
                "world_size + 1 hops; compared with the token each rank must end with (every element "
                "says whose token it is); the input left unchanged; messages only to the right "
                "neighbour and from the left one; collectives refused"),
        worker=ring_shift_worker),
]
