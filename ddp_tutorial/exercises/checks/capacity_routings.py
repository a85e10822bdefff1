"""Exercise 21.2's routings, its dense one-process reference, and the diagnosis of a dropped set.

``expected`` is the reference, a loop over the tokens written apart from any vectorised keep:
a count per expert, each choice kept while its count is within ``C``. A learner's dropped set
is read back from the output rows (``STAMP`` says which experts a row holds) and compared with
the sets the typical mistakes give (the last kept instead of the first, ``C`` rounded down or
computed per rank), so that the diagnosis names the mistake, not only the first wrong row.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

FEATURES = 3  # not 2: a learner's counts shaped (ranks, experts per rank = 2) never look like rows
STAMP = 100000.0  # compute for expert e adds STAMP * (e + 1): exact in float32 for these sizes


@dataclass(frozen=True)
class Routing:
    """One case: rank ``s`` holds ``tokens(s, n)`` tokens; ``choose(s, t, n, gen)`` is token ``t``'s experts."""

    label: str
    factor: float
    tokens: Callable[[int, int], int]
    choose: Callable[[int, int, int, torch.Generator], list[int]]
    k: int = 1  # choices per token


def rand(gen: torch.Generator, high: int) -> int:
    return int(torch.randint(high, (1,), generator=gen))


def one_extra_for_expert_1(s: int, t: int, n: int, gen: torch.Generator) -> list[int]:
    """``2E`` tokens, each expert twice (``C = 2`` at factor 1), but expert 1 three times and the last once."""
    experts = [e for e in range(2 * n) for _ in range(2)]
    experts[-1] = 1
    shuffled = torch.randperm(len(experts), generator=torch.Generator().manual_seed(100 + s)).tolist()
    return [experts[shuffled[t]]]


ROUTINGS = [
    Routing("random top-1, 6 + 2 * rank tokens, factor 1", 1.0, lambda s, n: 6 + 2 * s,
            lambda s, t, n, g: [rand(g, 2 * n)]),
    Routing("random top-2, 8 tokens, factor 1.25", 1.25, lambda s, n: 8,
            lambda s, t, n, g: torch.randperm(2 * n, generator=g)[:2].tolist(), k=2),
    Routing("every token to expert 0, the other ranks receive nothing, factor 1", 1.0, lambda s, n: 5 + s,
            lambda s, t, n, g: [0]),
    Routing("expert 1 overflows by one on every rank, factor 1", 1.0, lambda s, n: 4 * n, one_extra_for_expert_1),
    Routing("factor 8, large enough to drop nothing, top-2 crowding expert 0", 8.0, lambda s, n: 7,
            lambda s, t, n, g: [0, 1 + rand(g, 2 * n - 1)], k=2),
    Routing("rank 0 holds no token, the others crowd the last expert, factor 1.5", 1.5,
            lambda s, n: 0 if s == 0 else 4 + s, lambda s, t, n, g: [2 * n - 1 if t % 3 else rand(g, 2 * n)]),
    Routing("rounding up matters: 6 tokens, half to expert 1, factor 1.25", 1.25, lambda s, n: 6,
            lambda s, t, n, g: [1 if t % 2 == 0 else rand(g, 2 * n)]),
]


def chosen_of(routing: Routing, src: int, world_size: int) -> torch.Tensor:
    """Rank ``src``'s choices (tokens, k), the same on every rank: each rank can count what it must receive."""
    gen = torch.Generator().manual_seed(src)
    rows = [routing.choose(src, t, world_size, gen) for t in range(routing.tokens(src, world_size))]
    return torch.tensor(rows, dtype=torch.long).reshape(len(rows), routing.k)


def token_rows(src: int, tokens: int) -> torch.Tensor:
    """Rank ``src``'s tokens: ``[id, id + 0.5, id + 0.25]`` with ``id = src * 1000 + t``."""
    ids = torch.arange(tokens, dtype=torch.float32) + 1000 * src
    return torch.stack([ids, ids + 0.5, ids + 0.25], dim=1)


def expected(chosen: torch.Tensor, limit: int, *, last: bool = False, per: int = 1) -> set[tuple[int, int]]:
    """The kept ``(token, choice)`` pairs: the first ``limit`` per expert in token order (a dense loop).

    ``last``: the last ones instead; ``per``: experts counted together in blocks of ``per`` (a rank's).
    """
    order = [(t, j) for t in range(chosen.shape[0]) for j in range(chosen.shape[1])]
    taken: dict[int, int] = {}
    kept = set()
    for t, j in reversed(order) if last else order:
        queue = int(chosen[t, j]) // per
        taken[queue] = taken.get(queue, 0) + 1
        if taken[queue] <= limit:
            kept.add((t, j))
    return kept


def read_row(x: torch.Tensor, chosen: torch.Tensor, row: torch.Tensor) -> tuple[set[int], bool] | None:
    """Which of the token's choices ``row`` holds, and whether ``x`` itself was added (None: neither fits)."""
    k = chosen.shape[0]
    for picks in itertools.product((0, 1), repeat=k):
        stamps = sum(STAMP * (int(chosen[j]) + 1) * p for j, p in enumerate(picks))
        for residual in (0, 1):
            if torch.equal(row, (sum(picks) + residual) * x + stamps):
                return {j for j, p in enumerate(picks) if p}, bool(residual)
    return None


def capacity_diagnosis(rank: int, x: torch.Tensor, chosen: torch.Tensor, got: torch.Tensor, *,
                       kept: set[tuple[int, int]], factor: float, num_experts: int, world_size: int) -> str | None:
    """What is wrong with this rank's output rows ``got`` (None: each holds exactly its kept choices)."""
    tokens, k = chosen.shape
    got_kept: set[tuple[int, int]] = set()
    for t in range(tokens):
        read = read_row(x[t], chosen[t], got[t])
        want = sum((x[t] + STAMP * (int(chosen[t, j]) + 1) for j in range(k) if (t, j) in kept), torch.zeros_like(x[t]))
        if read is None:
            return (f"rank {rank}'s token {t} (experts {chosen[t].tolist()}) came back as {got[t].tolist()}, not "
                    f"{want.tolist()}: out[t] is the sum of compute's results for its kept choices, in its own row")
        picks, residual = read
        if residual:
            return (f"rank {rank}'s token {t} (experts {chosen[t].tolist()}) came back with x itself added: a dropped "
                    "choice adds nothing and a token with every choice dropped gets zeros, the residual connection "
                    "outside the layer adds x (here it would be counted twice)")
        got_kept |= {(t, j) for j in picks}
    if got_kept == kept:
        return None
    share = factor * tokens * k
    limit, floor, by_rank = math.ceil(share / num_experts), math.floor(share / num_experts), math.ceil(share / world_size)
    formula = f"C = ceil(capacity_factor * tokens * k / num_experts) = ceil({factor:g} * {tokens} * {k} / {num_experts})"
    if got_kept == expected(chosen, limit, last=True):
        return (f"rank {rank} kept the last assignments of each full expert, not the first: the contract keeps the "
                f"first C = {limit} in token order (token t's choices before token t + 1's)")
    if got_kept == expected(chosen, floor):
        return f"rank {rank} dropped as if C were {floor}, the capacity rounded down (floor): {formula} = {limit}"
    per_rank = num_experts // world_size
    if got_kept in (expected(chosen, by_rank), expected(chosen, by_rank, per=per_rank)):
        return (f"rank {rank} kept as if the capacity were per rank, ceil({share:g} / {world_size} ranks) = {by_rank}: "
                f"it is per expert, {formula} = {limit} for each expert")
    t, j = min(got_kept ^ kept)
    place = sum(int(chosen[u, i]) == int(chosen[t, j]) for u in range(tokens) for i in range(k) if (u, i) < (t, j))
    verb = "dropped, although it is" if (t, j) in kept else "kept, although it is"
    return (f"rank {rank}'s token {t}, choice {j} (expert {int(chosen[t, j])}) was {verb} number {place + 1} in its "
            f"expert's queue, with {formula} = {limit}: the first C in token order are kept, the others dropped")
