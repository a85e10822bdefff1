"""Lesson 21's exercise: dispatch rows by run-time split sizes with all-to-all, and combine them back.

Each row of rank ``s`` is labelled ``s * 1000 + i`` (its row ``i``), so a value says which
token it is; the checker's ``compute`` on rank ``d`` adds ``100000 * (d + 1)``, so a result
also says where it was computed. The reference is built without any collective: row ``i``
must come back as ``x[i] + 100000 * (destination[i] + 1)``. The checker records every
``all_to_all_single`` (any other collective is refused) and the rows each ``compute`` got,
compared with what the routing sends that rank (``watching.wrong_split``).
"""

from __future__ import annotations

import torch

from ddp_tutorial.env import rank_device
from ddp_tutorial.exercises.exercise import Exercise
from ddp_tutorial.exercises.harness import Case, Report, anyone_failed, load_function, run_cases
from ddp_tutorial.exercises.tracing import COLLECTIVES, traced
from ddp_tutorial.exercises.watching import routed_counts, wrong_split

STAMP = 100000.0  # compute on rank d adds STAMP * (d + 1): exact in float32 for these sizes
ALL_TO_ALL_ONLY = ("the exchange is all-to-all: dist.all_to_all_single for the counts, the rows, "
                   "and the results back")
BACKWARD = ("the backward of an all-to-all is the same all-to-all with the split sizes swapped: an "
            "autograd.Function around dist.all_to_all_single, or torch.distributed.nn.functional.all_to_all_single")
# (label, rows rank s holds, where rank s sends its row i): uneven row counts on purpose, so that a
# rank's own count never stands in for a peer's; ranks that receive nothing, and one that sends nothing
ROUTINGS = [
    ("random destinations, 5 + rank rows", lambda s: 5 + s, lambda s, i, n, g: int(torch.randint(n, (1,), generator=g))),
    ("every row to the last rank, 4 + 2 * rank rows", lambda s: 4 + 2 * s, lambda s, i, n, g: n - 1),
    ("rank 0 sends everything to rank 1 (or itself), the others to rank 0", lambda s: 3 + s,
     lambda s, i, n, g: min(1, n - 1) if s == 0 else 0),
    ("each row to the rank after its own, 7 rows", lambda s: 7, lambda s, i, n, g: (s + 1) % n),
    ("rank 0 has no row at all, the others random", lambda s: 0 if s == 0 else 3 + s,
     lambda s, i, n, g: int(torch.randint(n, (1,), generator=g))),
]


def routing(src: int, rows, where, *, world_size: int) -> torch.Tensor:  # noqa: ANN001  (ROUTINGS' functions)
    """Rank ``src``'s destinations, the same on every rank: each rank can count what it must receive."""
    gen = torch.Generator().manual_seed(src)
    return torch.tensor([where(src, i, world_size, gen) for i in range(rows(src))], dtype=torch.long)


def weight(src: int, rows: int) -> torch.Tensor:
    """The loss weight of each of rank ``src``'s rows: ``loss = (out * weight).sum()``, so ``x.grad = weight``."""
    return (torch.arange(rows, dtype=torch.float32) + 1 + 100 * src)[:, None].expand(rows, 2)


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


def gradients(rank: int, x: torch.Tensor, scale: torch.Tensor, *, incoming: list[tuple[torch.Tensor, torch.Tensor]],
              destination: torch.Tensor) -> str | None:
    """``x.grad`` must be each row's loss weight; ``scale.grad``, on the rank that computed, the sum of
    the received rows times their weights (``compute`` is ``received * scale + stamp``)."""
    want = weight(rank, len(x))
    grad = torch.zeros_like(x) if x.grad is None and len(x) == 0 else x.grad
    if grad is None:
        return f"rank {rank}'s x got no gradient, although its rows were used: {BACKWARD}"
    for i in range(len(x)):
        if not torch.equal(grad[i].cpu(), want[i]):
            return (f"forward right, but in backward rank {rank}'s row {i} (sent to rank {int(destination[i])}) got the "
                    f"gradient {grad[i].cpu().tolist()}, not {want[i].tolist()}: the gradient must travel back the way "
                    f"the row came; {BACKWARD}")
    expected = sum(float((w * rows).sum()) for rows, w in incoming)
    got = 0.0 if scale.grad is None else float(scale.grad)
    if abs(got - expected) > 1e-5 * max(1.0, abs(expected)):
        return (f"x's gradients are right, but the gradient of compute's own weight on rank {rank} is {got:g}, not "
                f"{expected:g}: the results' gradients must reach the rank that computed them (the combine's backward)")
    return None


def dispatch_combine_worker(rank: int, world_size: int, source: str, function: str, trace_dir: str) -> Report:
    """Each routing of ``ROUTINGS``: every row home, computed on its destination; three all-to-alls in forward;
    in backward every row's gradient home, and two all-to-alls on every rank (also one that got no row)."""
    others = tuple(c for c in COLLECTIVES if c != "all_to_all_single")
    with traced(rank, trace_dir, forbid=others, reason=ALL_TO_ALL_ONLY, record=("all_to_all_single",)) as trace:
        fn = load_function(source, function, refuse=("ddp_tutorial.expert_parallel",))

        def case(rows, where) -> str | None:  # noqa: ANN001  (a routing of ROUTINGS)
            device = rank_device()
            everyone = [routing(s, rows, where, world_size=world_size) for s in range(world_size)]
            destination = everyone[rank]
            x = token(rank, len(destination))
            want = x + STAMP * (destination[:, None].float() + 1)
            incoming = [(token(s, len(d))[d == rank], weight(s, len(d))[d == rank]) for s, d in enumerate(everyone)]
            scale = torch.ones((), device=device, requires_grad=True)  # compute's weight: 1, so values stay exact
            seen: list[int] = []

            def compute(received: torch.Tensor) -> torch.Tensor:
                seen.append(len(received))
                return received * scale + STAMP * (rank + 1)

            mine = x.to(device).requires_grad_()
            got = fn(mine, destination.to(device), compute)
            if len(seen) != 1:
                return f"compute was called {len(seen)} times on rank {rank}: call it once, on every row received"
            if not isinstance(got, torch.Tensor) or got.shape != x.shape:
                shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
                return f"it returned {shape}, not a tensor shaped like x {tuple(x.shape)}"
            values = got.detach().cpu()
            for i in range(len(x)):
                if not torch.equal(values[i], want[i]):
                    return misplaced(rank, i, int(destination[i]), values[i])
            routed = sum(counts[rank] for counts in routed_counts(everyone, world_size))
            wrong = wrong_split(rank, [seen[0]], [routed], every=[sum(len(d) for d in everyone)], who="compute")
            if wrong:
                return f"the results are right, but {wrong}"
            forward = len([c for c in trace.calls if c.kind == "all_to_all_single"])
            if world_size > 1 and forward != 3:
                return (f"the rows are right, but it made {forward} all_to_all_single calls: three are all it "
                        "needs (the counts, the rows, the results back)")
            # every rank decides together: a rank that goes into backward alone waits for the others forever
            if anyone_failed(not got.requires_grad):
                return (None if got.requires_grad else
                        f"rank {rank}'s result has no gradient path back to x ({len(x)} rows, {seen[0]} received): "
                        f"every rank must run the backward all-to-alls, also one that sent or received no row; {BACKWARD}")
            trace.phase = "backward"
            (got * weight(rank, len(x)).to(device)).sum().backward()
            trace.phase = ""
            backward = len([c for c in trace.calls if c.kind == "all_to_all_single"]) - forward
            problem = gradients(rank, mine, scale, incoming=incoming, destination=destination)
            if problem is None and world_size > 1 and backward != 2:
                problem = (f"the gradients are right, but backward made {backward} all_to_all_single calls on rank "
                           f"{rank}: two are all it needs (the results' gradients out, the rows' gradients home)")
            return problem

        cases: list[Case] = [(label, lambda r=rows, w=where: case(r, w)) for label, rows, where in ROUTINGS]
        return run_cases(trace, cases)


EXERCISES = [
    Exercise(
        name="dispatch_combine", number="21.1", lesson=21, notebook="21_expert_parallel.ipynb",
        title="dispatch rows by split sizes and combine them back", level="medium",
        task=("Send each row of x to the rank destination[i] names, where compute() runs on all the rows "
              "that arrived, and return the results in the rows' own places, differentiable; the numbers of "
              "rows are known only at run time, so exchange them first."),
        hint=("Three all_to_all_single calls: the counts per destination (torch.bincount), then the rows "
              "sorted by destination (torch.argsort(..., stable=True)) with input_split_sizes = your counts "
              "and output_split_sizes = the counts you received; compute; send back with the two lists "
              "swapped, and undo the sort: back[torch.argsort(order)]. For the gradient, wrap the last two in an "
              "autograd.Function whose backward is the same exchange with the sizes swapped."),
        checks=("5 routings on 1, 2 and 3 ranks with uneven row counts (random, all to one rank, one rank "
                "sending everything elsewhere, ranks receiving nothing, a rank with no row); every returned row "
                "compared with its own row computed on its destination rank, the first misplaced row named "
                "with the token it holds; compute called once per rank, on exactly the rows the routing sends "
                "that rank (not every rank's: an all-gather in disguise); backward: every row's gradient home "
                "and compute's own weight's gradient on the rank that computed, on every rank; three "
                "all_to_all_single calls in forward and two in backward, other collectives refused; "
                "ddp_tutorial.expert_parallel is refused"),
        hang_hint=("a rank is waiting in an all-to-all that a peer never joins. In backward every rank must run "
                   "the reversed all-to-alls, also one that sent or received no row: keep the empty tensors in "
                   "the autograd graph, never skip the collective for them"),
        worker=dispatch_combine_worker),
]
