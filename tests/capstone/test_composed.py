"""``ddp_tutorial.capstone.composed`` and ``ddp_tutorial.capstone.parallelize``: every layout equals one process.

Each layout trains ``CharGPT`` 3 Adam steps in float64 and is compared with
``reference.train_one_process``: the global loss of each step and every gathered weight,
within ``composed.TOLERANCE``. ``make test`` runs a representative subset on 4 ranks (each
pair of dp, tp, pp once, and dp x cp); ``make capstone-layouts`` (``DDP_TUTORIAL_ALL_LAYOUTS=1``)
runs all 33 layouts of up to 8 ranks, cp included, one launch per world size.
"""

from __future__ import annotations

import os

import pytest
import torch

from ddp_tutorial.capstone.composed import (
    TOLERANCE,
    compare,
    composed_runs,
    schedule_for,
)
from ddp_tutorial.capstone.layout import Layout, group_ranks, layouts
from ddp_tutorial.capstone.parallelize import pipeline_part, stage_layers
from ddp_tutorial.capstone.reference import GPTRun, make_gpt, train_one_process
from ddp_tutorial.launch import spawn

STEPS = 3
ALL = os.environ.get("DDP_TUTORIAL_ALL_LAYOUTS") == "1"


@pytest.fixture(scope="module")
def reference() -> dict:
    return train_one_process(GPTRun(), STEPS)


def check_runs(layouts_: list[Layout], reference: dict, timeout: float) -> None:
    world = layouts_[0].world_size
    results = spawn(composed_runs, world, args=([vars(lay) for lay in layouts_], STEPS), timeout=timeout)
    for i, layout in enumerate(layouts_):
        for rank in range(world):
            assert results[rank][i]["groups"] == group_ranks(rank, layout), (layout, rank)
            assert results[rank][i]["schedule"] == ("Schedule1F1B" if layout.pp > 1 else None), (layout, rank)
        diff = compare(results[0][i], reference)
        assert diff["loss"] < TOLERANCE and diff["weights"] < TOLERANCE, (str(layout), diff)


def test_the_comparison_can_fail(reference):
    """The steps move the weights far more than the tolerance, and a step less is caught."""
    start = {n: p.detach() for n, p in make_gpt(GPTRun()).named_parameters()}
    moved = max((reference["state"][n] - w).abs().max().item() for n, w in start.items())
    assert moved > 1e6 * TOLERANCE
    shorter = train_one_process(GPTRun(), STEPS - 1)
    assert compare({"losses": shorter["losses"] + [0.0], "state": shorter["state"]}, reference)["weights"] > 1e-4


def test_a_stage_keeps_its_blocks_under_their_names():
    assert stage_layers(4, 1, 2) == [2, 3] and stage_layers(4, 3, 4) == [3]
    with pytest.raises(ValueError, match="3 stages do not divide 4 layers"):
        stage_layers(4, 0, 3)
    whole = dict(make_gpt(GPTRun()).named_parameters())
    parts = [dict(pipeline_part(make_gpt(GPTRun()), s, 2).named_parameters()) for s in range(2)]
    assert not set(parts[0]) & set(parts[1]) and set(parts[0]) | set(parts[1]) == set(whole)
    assert "tok_embeddings.weight" in parts[0] and "output.weight" in parts[1] and "layers.2.ffn_norm.weight" in parts[1]
    assert all(torch.equal(p, whole[n]) for part in parts for n, p in part.items())


def test_the_pipeline_runs_1f1b_where_it_can():
    assert schedule_for(2, 2) == schedule_for(4, 4) == schedule_for(8, 2) == "1F1B"
    assert schedule_for(2, 4) == "GPipe"  # fewer microbatches than stages: 1F1B's warm-up cannot fill


def test_every_pair_of_parallelisms_equals_one_process(reference):
    pairs = [Layout(dp=2, tp=2), Layout(tp=2, pp=2), Layout(dp=2, pp=2), Layout(dp=2, cp=2)]
    check_runs(pairs, reference, timeout=180)


@pytest.mark.skipif(not ALL, reason="every layout: make capstone-layouts (DDP_TUTORIAL_ALL_LAYOUTS=1)")
@pytest.mark.parametrize("world", [1, 2, 4, 8])
def test_every_layout_equals_one_process(world, reference):
    runnable = [lay for lay in layouts(8, **GPTRun().model_limits()) if lay.world_size == world]
    check_runs(runnable, reference, timeout=600)


def test_the_layout_rules_know_the_runs_model():
    assert layouts() == layouts(8, **GPTRun().model_limits())  # layout's defaults are GPTRun's
