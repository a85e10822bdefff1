"""Exercise 21.2's reference and diagnosis, in one process (``ddp_tutorial.exercises.checks.capacity_routings``).

The dense loop ``expected`` is held against the lesson's vectorised ``keep_mask`` (a cumsum of a
one-hot, written another way), each routing is checked to be the edge case its label promises,
and outputs built by hand with each typical mistake get the diagnosis that names it.
"""

from __future__ import annotations

import math

import pytest
import torch

from ddp_tutorial.exercises.checks.capacity_routings import (
    ROUTINGS,
    STAMP,
    capacity_diagnosis,
    chosen_of,
    expected,
    token_rows,
)
from ddp_tutorial.expert_parallel.routing import capacity, keep_mask

BY_LABEL = {r.label.split(",")[0]: r for r in ROUTINGS}


def kept_pairs(mask: torch.Tensor) -> set[tuple[int, int]]:
    return {(t, j) for t, j in mask.nonzero().tolist()}


def output(x: torch.Tensor, chosen: torch.Tensor, kept: set[tuple[int, int]]) -> torch.Tensor:
    """What the checker's compute makes of the kept choices, summed per token (the right answer for ``kept``)."""
    out = torch.zeros_like(x)
    for t, j in kept:
        out[t] += x[t] + STAMP * (int(chosen[t, j]) + 1)
    return out


@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize("routing", ROUTINGS, ids=lambda r: r.label.split(",")[0])
def test_the_dense_loop_keeps_what_the_lessons_vectorised_keep_mask_keeps(routing, world_size):
    experts = 2 * world_size
    for src in range(world_size):
        chosen = chosen_of(routing, src, world_size)
        limit = capacity(len(chosen), chosen.shape[1], experts, routing.factor)
        assert expected(chosen, limit) == kept_pairs(keep_mask(chosen, experts, limit))
        backwards = keep_mask(chosen.flip(0), experts, limit).flip(0)  # the last ones: the queue reversed
        if chosen.shape[1] == 1:
            assert expected(chosen, limit, last=True) == kept_pairs(backwards)


@pytest.mark.parametrize("world_size", [2, 4])
def test_each_routing_is_the_edge_case_its_label_names(world_size):
    experts = 2 * world_size

    def dropped(label: str, src: int) -> int:
        chosen = chosen_of(BY_LABEL[label], src, world_size)
        return chosen.numel() - len(expected(chosen, capacity(len(chosen), chosen.shape[1], experts,
                                                              BY_LABEL[label].factor)))

    everyone = [chosen_of(BY_LABEL["every token to expert 0"], s, world_size) for s in range(world_size)]
    assert all((c == 0).all() for c in everyone)  # ranks 1.. hold experts 2.. and receive nothing
    assert all(dropped("expert 1 overflows by one on every rank", s) == 1 for s in range(world_size))
    assert all(dropped("factor 8", s) == 0 for s in range(world_size))
    crowded = chosen_of(BY_LABEL["factor 8"], 0, world_size)  # at factor 1 expert 0 would drop some
    assert len(expected(crowded, capacity(len(crowded), 2, experts, 1.0))) < crowded.numel()
    assert len(chosen_of(BY_LABEL["rank 0 holds no token"], 0, world_size)) == 0
    rounding = BY_LABEL["rounding up matters: 6 tokens"]
    share = rounding.factor * 6 / experts
    assert math.floor(share) != math.ceil(share) and dropped("rounding up matters: 6 tokens", 0) > 0


def test_the_diagnosis_names_each_typical_mistake():
    routing, n = BY_LABEL["every token to expert 0"], 2
    chosen = chosen_of(routing, 0, n)  # 5 tokens, all to expert 0: C = ceil(5 / 4) = 2
    x = token_rows(0, len(chosen))
    kept = expected(chosen, 2)
    assert kept == {(0, 0), (1, 0)}
    args = dict(kept=kept, factor=1.0, num_experts=4, world_size=n)
    assert capacity_diagnosis(0, x, chosen, output(x, chosen, kept), **args) is None
    last = capacity_diagnosis(0, x, chosen, output(x, chosen, {(3, 0), (4, 0)}), **args)
    assert "kept the last assignments" in last and "not the first" in last
    floor = capacity_diagnosis(0, x, chosen, output(x, chosen, {(0, 0)}), **args)
    assert "rounded down (floor)" in floor and "= 2" in floor
    per_rank = capacity_diagnosis(0, x, chosen, output(x, chosen, {(t, 0) for t in range(3)}), **args)
    assert "as if the capacity were per rank, ceil(5 / 2 ranks) = 3" in per_rank
    residual = output(x, chosen, kept)
    residual[2:] = x[2:]
    assert "x itself added" in capacity_diagnosis(0, x, chosen, residual, **args)
    odd = capacity_diagnosis(0, x, chosen, output(x, chosen, {(0, 0), (2, 0)}), **args)  # none of those mistakes
    assert "token 1, choice 0 (expert 0) was dropped, although it is number 2 in its expert's queue" in odd
    misplaced = output(x, chosen, kept).flip(0)
    assert "came back as" in capacity_diagnosis(0, x, chosen, misplaced, **args)
