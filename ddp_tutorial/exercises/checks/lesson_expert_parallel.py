"""Lesson 21's exercise: dispatch rows by run-time split sizes with all-to-all, and combine them back.

Each row of rank ``s`` is labelled ``s * 1000 + i`` (its row ``i``), so a value says which
token it is; the checker's ``compute`` on rank ``d`` adds ``100000 * (d + 1)``, so a result
also says where it was computed. The reference is built without any collective: row ``i``
must come back as ``x[i] + 100000 * (destination[i] + 1)``. The checker records every
``all_to_all_single`` (any other collective is refused) and the rows each ``compute`` got.
"""

from __future__ import annotations

import torch

from ddp_tutorial.env import rank_device
from ddp_tutorial.exercises.exercise import Exercise
from ddp_tutorial.exercises.harness import Case, Report, load_function, run_cases
from ddp_tutorial.exercises.tracing import COLLECTIVES, traced

STAMP = 100000.0  # compute on rank d adds STAMP * (d + 1): exact in float32 for these sizes
ALL_TO_ALL_ONLY = ("the exchange is all-to-all: dist.all_to_all_single for the counts, the rows, "
                   "and the results back")
# (label, rows on each rank, where rank s sends its row i)
ROUTINGS = [
    ("random destinations", 5, lambda s, i, n, g: int(torch.randint(n, (1,), generator=g))),
    ("every row to the last rank", 4, lambda s, i, n, g: n - 1),
    ("rank 0 sends everything to rank 1 (or itself), the others to rank 0", 3,
     lambda s, i, n, g: min(1, n - 1) if s == 0 else 0),
    ("each row to the rank after its own, 7 rows", 7, lambda s, i, n, g: (s + 1) % n),
]


def token(src: int, rows: int) -> torch.Tensor:
    """Rank ``src``'s rows: ``[src*1000 + i, src*1000 + i + 0.5]``."""
    ids = torch.arange(rows, dtype=torch.float32) + 1000 * src
    return torch.stack([ids, ids + 0.5], dim=1)


def read(value: torch.Tensor) -> tuple[int, int, int]:
    """``(source rank, row, rank it was computed on)`` of a returned row (-1: never computed)."""
    first = float(value[0])
    where = int(first // STAMP) - 1
    src, i = divmod(int(round(first - STAMP * (where + 1))), 1000)
    return src, i, where


def misplaced(rank: int, i: int, destination: int, got: torch.Tensor) -> str:
    """What is wrong with row ``i``'s result ``got``, in words."""
    src, j, where = read(got)
    start = f"rank {rank}'s row {i} (sent to rank {destination}) came back"
    if (src, j) == (rank, i):
        if where < 0:
            return f"{start} as it left: no rank's compute saw it"
        return (f"{start} to its place, but computed on rank {where}: compute runs on the rows a rank "
                "received, after the dispatch")
    held = f"row {j} of rank {src}, " + ("never computed" if where < 0 else f"computed on rank {where}")
    return (f"{start} holding {held}: the results must return to the rows they came from "
            "(send back with the split sizes swapped, then undo the sort)")


def dispatch_combine_worker(rank: int, world_size: int, source: str, function: str, trace_dir: str) -> Report:
    """Each routing of ``ROUTINGS``: every row home, computed on its destination; three all-to-alls."""
    others = tuple(c for c in COLLECTIVES if c != "all_to_all_single")
    with traced(rank, trace_dir, forbid=others, reason=ALL_TO_ALL_ONLY, record=("all_to_all_single",)) as trace:
        fn = load_function(source, function, refuse=("ddp_tutorial.expert_parallel",))

        def case(rows: int, where) -> str | None:  # noqa: ANN001  (a routing of ROUTINGS)
            device = rank_device()
            gen = torch.Generator().manual_seed(rank)
            destination = torch.tensor([where(rank, i, world_size, gen) for i in range(rows)], dtype=torch.long)
            x = token(rank, rows)
            want = x + STAMP * (destination[:, None].float() + 1)
            seen: list[int] = []

            def compute(received: torch.Tensor) -> torch.Tensor:
                seen.append(len(received))
                return received + STAMP * (rank + 1)

            got = fn(x.to(device), destination.to(device), compute)
            if len(seen) != 1:
                return f"compute was called {len(seen)} times on rank {rank}: call it once, on every row received"
            if not isinstance(got, torch.Tensor) or got.shape != x.shape:
                shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
                return f"it returned {shape}, not a tensor shaped like x {tuple(x.shape)}"
            got = got.detach().cpu()
            for i in range(rows):
                if not torch.equal(got[i], want[i]):
                    return misplaced(rank, i, int(destination[i]), got[i])
            calls = [c for c in trace.calls if c.kind == "all_to_all_single"]
            if world_size > 1 and len(calls) != 3:
                return (f"the rows are right, but it made {len(calls)} all_to_all_single calls: three are all it "
                        "needs (the counts, the rows, the results back)")
            return None

        cases: list[Case] = [(label, lambda r=rows, w=where: case(r, w)) for label, rows, where in ROUTINGS]
        return run_cases(trace, cases)


EXERCISES = [
    Exercise(
        name="dispatch_combine", number="21.1", lesson=21, notebook="21_expert_parallel.ipynb",
        title="dispatch rows by split sizes and combine them back", level="medium",
        task=("Send each row of x to the rank destination[i] names, where compute() runs on all the rows "
              "that arrived, and return the results in the rows' own places; the numbers of rows are known "
              "only at run time, so exchange them first."),
        hint=("Three all_to_all_single calls: the counts per destination (torch.bincount), then the rows "
              "sorted by destination (torch.argsort(..., stable=True)) with input_split_sizes = your counts "
              "and output_split_sizes = the counts you received; compute; send back with the two lists "
              "swapped, and undo the sort: out[order] = back."),
        checks=("4 routings on 1, 2 and 3 ranks (random, all to one rank, one rank sending everything "
                "elsewhere, ranks receiving nothing); every returned row compared with its own row computed "
                "on its destination rank, the first misplaced row named with the token it holds; compute "
                "called once per rank; exactly three all_to_all_single calls, other collectives refused; "
                "ddp_tutorial.expert_parallel is refused"),
        worker=dispatch_combine_worker),
]
