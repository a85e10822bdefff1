"""ddp_tutorial.data_parallel.overlap: the local variant communicates with nobody; the replayed messages are the wrappers' own."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.distributed as dist
from torch import nn

from ddp_tutorial.data_parallel.overlap import RUNGS, exposed_communication, message_sizes, wrap_rung
from ddp_tutorial.launch import spawn
from ddp_tutorial.models import make_model

pytestmark = pytest.mark.timeout(180)


def local_and_world_grads(rank: int, world_size: int) -> dict:
    """For each rung: max |grad - plain local grad| on a group of one, and on the world (against the mean)."""
    base, (n_in, n_out) = make_model("mlp", seed=0, dtype=torch.float64)
    alone = [dist.new_group([r]) for r in range(world_size)][rank]
    x = torch.randn(6, n_in, generator=torch.Generator().manual_seed(rank), dtype=torch.float64)

    def grads(model):
        model(x).square().mean().backward()
        return [p.grad.clone() for p in (model.module if hasattr(model, "module") else model).parameters()]

    plain = grads(copy.deepcopy(base))  # no wrapper at all: this rank's own gradients
    mean = []
    for g in plain:  # the world's mean, computed another way: all_gather, then average
        parts = [torch.empty_like(g) for _ in range(world_size)]
        dist.all_gather(parts, g)
        mean.append(torch.stack(parts).mean(0))
    out = {}
    for kind in RUNGS:
        solo = grads(wrap_rung(kind, copy.deepcopy(base), alone))
        world = grads(wrap_rung(kind, copy.deepcopy(base)))
        out[kind] = (max((a - b).abs().max().item() for a, b in zip(solo, plain)),
                     max((a - b).abs().max().item() for a, b in zip(world, mean)))
    return out


def test_a_group_of_one_gives_local_gradients_and_the_world_gives_their_mean():
    for per_rank in spawn(local_and_world_grads, 2, timeout=120):
        for kind, (solo_gap, world_gap) in per_rank.items():
            assert solo_gap < 1e-12 and world_gap < 1e-12, (kind, solo_gap, world_gap)


def sizes_of_every_rung(rank: int, world_size: int) -> dict:
    base, (n_in, n_out) = make_model("big", seed=0)
    x, y = torch.randn(4, n_in), torch.randn(4, n_out)
    step = lambda m: nn.functional.mse_loss(m(x), y).backward()  # noqa: E731  (a one-line helper, read beside its only use)
    return {"numels": [p.numel() for p in base.parameters()],
            **{kind: message_sizes(kind, wrap_rung(kind, copy.deepcopy(base)), step) for kind in RUNGS}}


def test_each_rung_sends_every_gradient_once():
    result = spawn(sizes_of_every_rung, 2, timeout=120)[0]
    numels = result["numels"]
    assert result["naive"] == numels  # one all-reduce per tensor (in parameter order)
    assert result["flat"] == [sum(numels)]
    for kind in ("bucketed", "torch"):  # buckets: the tensors split, none left out or sent twice
        assert sum(result[kind]) == sum(numels) and 1 < len(result[kind]) < len(numels), (kind, result[kind])


def test_exposed_communication_reports_every_rung():
    results = spawn(exposed_communication, 2, args=(RUNGS, 1, 2), timeout=150)
    for per_rank in results:
        assert set(per_rank) == set(RUNGS)
        for kind, row in per_rank.items():
            assert all(0 < row[what] < 10 and math.isfinite(row[what]) for what in ("step", "local", "comm"))
        assert per_rank["naive"]["messages"] == 32 and per_rank["flat"]["messages"] == 1
