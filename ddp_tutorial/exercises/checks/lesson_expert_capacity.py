"""Lesson 21's second exercise: expert-parallel dispatch with a capacity, the overflow dropped before it travels.

Rank ``s``'s token ``t`` is labelled ``s * 1000 + t``, and the checker's ``compute`` for expert
``e`` adds ``STAMP * (e + 1)``, so every output row says which of its choices were kept. The
reference is a dense loop over the tokens in one process (``expected``), no collective: a
count per expert, a choice kept while its count is within ``C``. The checker records every
``all_to_all_single`` with its split sizes (any other collective is refused) and the rows each
``compute`` got; ``capacity_diagnosis`` names the typical mistakes by the dropped set they give,
and ``watching.wrong_split`` the split sizes that are not the kept rows' (``routed_counts``).
"""

from __future__ import annotations

import math

import torch

from ddp_tutorial.env import rank_device
from ddp_tutorial.exercises.checks.capacity_routings import (
    FEATURES,
    ROUTINGS,
    STAMP,
    Routing,
    capacity_diagnosis,
    chosen_of,
    expected,
    token_rows,
)
from ddp_tutorial.exercises.exercise import Exercise
from ddp_tutorial.exercises.harness import Case, Report, load_function, run_cases
from ddp_tutorial.exercises.recording import LibraryCall, learner_calls, recording
from ddp_tutorial.exercises.tracing import COLLECTIVES, traced
from ddp_tutorial.exercises.watching import routed_counts, wrong_split

ALL_TO_ALL_ONLY = "the exchange is all-to-all: dist.all_to_all_single for the counts, the rows, and the results back"
ALL_TO_ALL = {"all_to_all_single": ["torch.distributed:all_to_all_single",
                                    "torch.distributed.distributed_c10d:all_to_all_single"]}
DROP_FIRST = ("drop before the all-to-all: the capacity is decided on the rank that holds the tokens, and a dropped "
              "assignment never travels (sending the overflow and discarding it later gives the same numbers with "
              "the traffic and compute of no capacity at all)")


def parts(call: LibraryCall, which: str, n: int) -> list[int]:
    """The rows per peer of one recorded ``all_to_all_single``: ``which`` is "input" (sent) or "output" (received)."""
    tensor = call.arguments.get(which)
    sizes = call.arguments.get(f"{which}_split_sizes")
    rows = len(tensor) if isinstance(tensor, torch.Tensor) and tensor.dim() else 0
    return [int(s) for s in sizes] if sizes else [rows // n] * n


def carries_rows(call: LibraryCall) -> bool:
    """A dispatch or combine: floating rows of the tokens' width (the counts and the experts' numbers are not)."""
    tensor = call.arguments.get("input")
    return isinstance(tensor, torch.Tensor) and tensor.is_floating_point() and tensor.dim() == 2 \
        and tensor.shape[1] >= FEATURES


def traffic(rank: int, calls: list[LibraryCall], *, send: list[int], recv: list[int], tokens: int,
            assignments: int) -> str | None:
    """The two row-carrying all-to-alls must carry exactly the kept rows: ``send[d]`` to rank ``d``, ``recv[s]`` from ``s``."""
    n = len(send)
    rows = [c for c in calls if carries_rows(c)]
    if len(rows) != 2:
        return (f"the results are right, but {len(rows)} all_to_all_single calls on rank {rank} carried rows of x: "
                "two are all it needs, the dispatch (the kept rows out) and the combine (their results back)")
    dispatch, combine = rows
    sent, got = parts(dispatch, "input", n), parts(dispatch, "output", n)
    every = next((e for e in ([tokens] * n, [assignments] * n) if sent == e), None) if n > 1 else None
    more = any(s > w for s, w in zip(sent, send))
    wrong = (wrong_split(rank, sent, send, every=every, sent=True, who="dispatch", routing="the routing with capacity",
                         advice=DROP_FIRST if more else "each kept row once, to its expert's rank")
             or wrong_split(rank, got, recv, who="dispatch", routing="the routing with capacity",
                            advice="output_split_sizes are the counts the peers sent"))
    if wrong:
        return f"the results are right, but {wrong}"
    if parts(combine, "input", n) != recv or parts(combine, "output", n) != send:
        return (f"the results are right, but rank {rank}'s combine sent {parts(combine, 'input', n)} and received "
                f"{parts(combine, 'output', n)} rows, where the results of the kept rows are {recv} out and {send} "
                "back: the dispatch's split sizes, swapped")
    return None


def received(rank: int, seen: list[tuple[torch.Tensor, torch.Tensor]], want: list[tuple[int, int, int]], *,
             dropped: set[tuple[int, int, int]], per_rank: int) -> str | None:
    """What ``compute`` got on this rank, as ``(source rank, token, expert)``, against the kept ones routed here."""
    if len(seen) != 1:
        return f"compute was called {len(seen)} times on rank {rank}: call it once, on every row received"
    rows, experts = seen[0]
    got = sorted((*divmod(int(rows[j, 0]), 1000), int(experts[j])) for j in range(len(rows)))
    if got == sorted(want):
        return None
    elsewhere = [g for g in got if g[2] // per_rank != rank]
    if elsewhere:
        src, t, e = elsewhere[0]
        return (f"rank {rank}'s compute got token {t} of rank {src} for expert {e}, which lives on rank {e // per_rank}: "
                "compute runs only on the rows a rank's own experts received (not every rank's rows: an all-gather in "
                "disguise)")
    over = [g for g in got if g in dropped]
    if over:
        src, t, e = over[0]
        return (f"the results are right, but rank {rank}'s compute got token {t} of rank {src} for expert {e}, which "
                f"the capacity drops ({len(over)} such rows): {DROP_FIRST}")
    missing = sorted(set(want) - set(got))
    what = f"lacks token {missing[0][1]} of rank {missing[0][0]} for expert {missing[0][2]}" if missing else \
        f"got {len(got)} rows where {len(want)} kept ones are routed here"
    return f"rank {rank}'s compute {what}: each kept (token, expert) row goes once to its expert's rank"


def capacity_dispatch_worker(rank: int, world_size: int, source: str, function: str, trace_dir: str) -> Report:
    """Each routing of ``ROUTINGS``: the output and the dropped set equal to the dense loop, compute on exactly
    the kept rows of this rank's experts, and the two row all-to-alls carrying exactly those rows."""
    others = tuple(c for c in COLLECTIVES if c != "all_to_all_single")
    with traced(rank, trace_dir, forbid=others, reason=ALL_TO_ALL_ONLY) as trace, recording(trace, ALL_TO_ALL) as calls:
        fn = load_function(source, function, refuse=("ddp_tutorial.expert_parallel",))

        def case(routing: Routing) -> str | None:
            n, device = world_size, rank_device()
            num_experts, per_rank = 2 * n, 2
            everyone = [chosen_of(routing, s, n) for s in range(n)]
            limits = [math.ceil(routing.factor * len(c) * c.shape[1] / num_experts) for c in everyone]
            kept = [expected(c, limits[s]) for s, c in enumerate(everyone)]
            mine, x = everyone[rank], token_rows(rank, len(everyone[rank]))
            routed_here = [(s, t, int(c[t, j])) for s, c in enumerate(everyone) for t, j in kept[s]
                           if int(c[t, j]) // per_rank == rank]
            dropped = {(s, t, int(c[t, j])) for s, c in enumerate(everyone) for t in range(len(c))
                       for j in range(c.shape[1]) if (t, j) not in kept[s]}
            seen: list[tuple[torch.Tensor, torch.Tensor]] = []

            def compute(rows: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
                seen.append((rows.detach().cpu().clone(), torch.as_tensor(experts).detach().cpu().clone()))
                return rows + STAMP * (torch.as_tensor(experts, device=rows.device)[:, None].to(rows.dtype) + 1)

            start = len(learner_calls(calls, "all_to_all_single"))
            got = fn(x.to(device), mine.to(device), compute, num_experts=num_experts, capacity_factor=routing.factor)
            if not isinstance(got, torch.Tensor) or got.shape != x.shape:
                shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
                return f"it returned {shape}, not a tensor shaped like x {tuple(x.shape)}"
            problem = capacity_diagnosis(rank, x, mine, got.detach().cpu(), kept=kept[rank], factor=routing.factor,
                                         num_experts=num_experts, world_size=n)
            problem = problem or received(rank, seen, routed_here, dropped=dropped, per_rank=per_rank)
            if problem:
                return problem
            counts = routed_counts([[int(c[t, j]) // per_rank for t, j in kept[s]] for s, c in enumerate(everyone)], n)
            send, recv = counts[rank], [counts[s][rank] for s in range(n)]
            mine_calls = learner_calls(calls, "all_to_all_single")[start:]
            return traffic(rank, mine_calls, send=send, recv=recv, tokens=len(x), assignments=mine.numel())

        cases: list[Case] = [(r.label, lambda r=r: case(r)) for r in ROUTINGS]
        return run_cases(trace, cases)


EXERCISES = [
    Exercise(
        name="capacity_dispatch", number="21.2", lesson=21, notebook="21_expert_parallel.ipynb",
        title="dispatch with a capacity factor: the overflow dropped before it travels", level="hard",
        task=("Route each token's kept choices to their experts' ranks and combine the results: each expert takes "
              "at most C = ceil(capacity_factor * tokens * k / num_experts) of this rank's assignments, the first in "
              "token order; the rest are dropped here, never sent, and add nothing to the output."),
        hint=("Decide on the sending rank, before any message, which assignments stay: walk them in token order "
              "and give each one its place in its expert's queue; those at a place below C travel, one row each. "
              "Then it is exercise 21.1 with the kept rows (and their experts' numbers) in place of x."),
        more_hints=("The place of an assignment is how many assignments to the same expert come before it in "
                    "chosen.reshape(-1) (token-major). A running count per expert gives it at once: the cumulative "
                    "sum of a one-hot over the experts, read at the assignment's own expert. Round C up (math.ceil): "
                    "the capacity is per expert, num_experts in the denominator, not the number of ranks.",
                    "one_hot = F.one_hot(chosen.reshape(-1), num_experts); place = (one_hot.cumsum(0) * "
                    "one_hot).sum(1) - 1; keep = place < C. Sort the kept ones by expert (stable), count them per "
                    "rank with bincount(expert // (num_experts // n)), exchange the counts, send x[token] and the "
                    "experts' numbers with those split sizes, compute, send back with the sizes swapped, and "
                    "index_add_ each result into a zero tensor at its token."),
        checks=("7 routings on 2 and 4 ranks, 2 experts per rank, top-1 and top-2, uneven token counts (random, every "
                "token to one expert so that the other ranks receive nothing, an expert overflowing by one, a "
                "factor large enough to drop nothing, a rank with no token, rounding that matters); every output "
                "row and the dropped set compared with a dense loop over the tokens in one process, the mistake "
                "named (the last tokens kept, the capacity rounded down or computed per rank, the residual added "
                "for a dropped token); compute called once per rank on exactly the kept rows of its own experts; the "
                "split sizes of the dispatch and the combine equal to the kept rows (not the overflow, not every "
                "row to every rank); collectives other than all_to_all_single refused; ddp_tutorial.expert_parallel "
                "is refused"),
        hang_hint=("a rank is waiting in an all-to-all that a peer never joins: every rank makes the same all-to-all "
                   "calls in the same order, also one that holds no token or keeps none"),
        world_sizes=(2, 4),
        worker=capacity_dispatch_worker),
]
