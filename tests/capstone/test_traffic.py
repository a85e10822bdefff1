"""``ddp_tutorial.capstone.traffic``: each mesh dimension's collectives per step, and each rank's bytes.

The recorded counts are checked against counts derived from the layout and the parallelisation
plans (blocks per stage, FSDP2 units, TP's gathers and reduce-scatters per block, microbatches),
and the bytes against the one-process model's parameters; one 4-rank launch runs four layouts,
``make capstone-layouts`` every layout of 8 ranks.
"""

from __future__ import annotations

import os

import pytest

from ddp_tutorial.capstone.layout import Layout, coordinates, layouts, microbatches_for
from ddp_tutorial.capstone.reference import GPTRun, make_gpt
from ddp_tutorial.capstone.traffic import op_kind, traffic_runs
from ddp_tutorial.launch import spawn

LAYOUTS = [Layout(dp=2, tp=2), Layout(tp=2, pp=2), Layout(dp=2, pp=2), Layout(dp=2, cp=2)]


def expected_counts(rank: int, layout: Layout, run: GPTRun) -> dict:
    """What one step must issue on each group, derived from the plans, not recorded."""
    stage = coordinates(rank, layout)["pp"]
    blocks = run.layers // layout.pp
    first, last = stage == 0, stage == layout.pp - 1
    m = microbatches_for(layout.pp, run.microbatches) if layout.pp > 1 else 1
    out = {}
    if layout.tp > 1:
        # Per block and microbatch: 2 sequence gathers and 2 reduce-scatters forward, their mirror
        # backward; the embedding one reduce-scatter, the head one gather in and one of the logits.
        out[("tp", "all_gather")] = m * (4 * blocks + first + 2 * last)
        out[("tp", "reduce_scatter")] = m * (4 * blocks + first + last)
        # The norms' replicated weights and biases (2 norms a block, the final one on the last
        # stage): their gradients summed once per step (by FSDP2, by the optimizer's DTensor
        # ops, or pipelined by composed's averaging of the microbatches).
        out[("tp", "all_reduce")] = 4 * blocks + 2 * last
    if layout.dp * layout.cp > 1:  # FSDP2 over the ranks of the same weights: dp, cp, or both flattened
        fsdp = "dp_cp" if layout.dp > 1 and layout.cp > 1 else "dp" if layout.dp > 1 else "cp"
        units = blocks + (first or last)  # every block, and the root where it holds weights
        out[(fsdp, "reduce_scatter")] = units  # once per step, after the last microbatch
        # Blocks gather again for backward unless pipelined; the root never reshards.
        out[(fsdp, "all_gather")] = units if layout.pp > 1 else 2 * units - 1
    if layout.cp > 1:
        # Ring attention, per block and microbatch: the K/V block shifted n - 1 times forward and
        # n - 1 times backward, and its gradient n times beside it (home after a full turn).
        n = layout.cp
        out[("cp", "send")] = out[("cp", "recv")] = m * blocks * (3 * n - 2)
    if layout.pp > 1:
        neighbours = (not first) + (not last)
        out[("pp", "send")] = out[("pp", "recv")] = m * neighbours
    return out


@pytest.fixture(scope="module")
def recorded() -> list:
    return spawn(traffic_runs, 4, args=([vars(lay) for lay in LAYOUTS],), timeout=240)


def test_operator_names_map_to_collectives():
    assert op_kind("c10d::_allgather_base_") == "all_gather"
    assert op_kind("_c10d_functional::reduce_scatter_tensor") == "reduce_scatter"
    assert op_kind("c10d::recv_") == "recv" and op_kind("c10d::allreduce_") == "all_reduce"
    assert op_kind("_c10d_functional::wait_tensor") is None and op_kind("aten::mm") is None


@pytest.mark.parametrize("index", range(len(LAYOUTS)))
def test_each_group_runs_the_collectives_the_plan_implies(recorded, index):
    layout = LAYOUTS[index]
    for rank in range(4):
        assert recorded[rank][index]["counts"] == expected_counts(rank, layout, GPTRun()), (str(layout), rank)


@pytest.mark.parametrize("index", range(len(LAYOUTS)))
def test_bytes_per_rank_add_up_to_the_model(recorded, index):
    """Summed over ranks: every weight once, the norms once per tp rank (they are replicated there)."""
    layout = LAYOUTS[index]
    whole = dict(make_gpt(GPTRun()).named_parameters())
    expected = sum(p.numel() * p.element_size() * (layout.tp if "norm" in n else 1) for n, p in whole.items())
    held = [recorded[rank][index]["bytes"] for rank in range(4)]
    assert sum(h["parameters"] for h in held) == expected, str(layout)
    for h in held:  # Adam: two moments shaped like the shards, and one float32 step per tensor
        assert (h["optimizer"] - 2 * h["parameters"]) % 4 == 0 and 0 < h["optimizer"] - 2 * h["parameters"] < 200


@pytest.mark.skipif(os.environ.get("DDP_TUTORIAL_ALL_LAYOUTS") != "1",
                    reason="every layout of 8 ranks: make capstone-layouts (DDP_TUTORIAL_ALL_LAYOUTS=1)")
def test_every_layout_of_8_ranks_runs_the_derived_collectives():
    eight = [lay for lay in layouts(8, **GPTRun().model_limits()) if lay.world_size == 8]
    results = spawn(traffic_runs, 8, args=([vars(lay) for lay in eight],), timeout=600)
    for i, layout in enumerate(eight):
        for rank in range(8):
            assert results[rank][i]["counts"] == expected_counts(rank, layout, GPTRun()), (str(layout), rank)
