"""``ddp_tutorial.capstone.traffic``: each mesh dimension's collectives per step, and each rank's bytes.

The recorded counts are checked against counts derived from the layout and the parallelisation
plans (blocks per stage, FSDP2 units, TP's gathers and reduce-scatters per block, microbatches),
FSDP2's and the pipeline's bytes sent against the one-process model's tensors and the batch's
shape, and the bytes held against the one-process model's parameters; one 4-rank launch runs four layouts,
``make capstone-layouts`` every layout of 8 ranks, with lesson 22's claims about its table of them.
"""

from __future__ import annotations

import os

import pytest

from ddp_tutorial.capstone.layout import Layout, coordinates, layouts, microbatches_for
from ddp_tutorial.capstone.parallelize import stage_layers
from ddp_tutorial.capstone.rank_memory import capstone_shape
from ddp_tutorial.capstone.reference import GPTRun, make_gpt
from ddp_tutorial.capstone.traffic import layout_row, op_kind, traffic_runs, wire_bytes
from ddp_tutorial.launch import spawn
from ddp_tutorial.sharding.calculator import bytes_per_rank

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


def expected_sent(rank: int, layout: Layout, run: GPTRun) -> dict:
    """Bytes one step sends on FSDP2's and the pipeline's groups, counted from the one-process model's
    tensors and the batch's shape, not recorded: FSDP2 gathers each unit's shards, (n - 1) copies of
    this rank's shard (blocks twice unless pipelined, the root once) and reduce-scatters each unit's
    whole gradient, (n - 1)/n of it; a stage sends each microbatch's activations or their gradient."""
    stage = coordinates(rank, layout)["pp"]
    blocks = tuple(f"layers.{i}." for i in stage_layers(run.layers, stage, layout.pp))
    first, last = stage == 0, stage == layout.pp - 1
    m = microbatches_for(layout.pp, run.microbatches) if layout.pp > 1 else 1
    n = layout.dp * layout.cp
    out = {}
    if n > 1:
        fsdp = "dp_cp" if layout.dp > 1 and layout.cp > 1 else "dp" if layout.dp > 1 else "cp"
        block = root = 0
        for name, p in make_gpt(run).named_parameters():
            local = p.numel() * p.element_size() // (1 if "norm" in name else layout.tp) // n  # no padding here
            if name.startswith(blocks):
                block += local
            elif (first and name.startswith("tok_embeddings")) or (last and name.startswith(("norm.", "output."))):
                root += local
        out[(fsdp, "all_gather")] = (n - 1) * ((1 if layout.pp > 1 else 2) * block + root)
        out[(fsdp, "reduce_scatter")] = (n - 1) * (block + root)
    if layout.pp > 1:
        rows = run.global_batch // layout.dp // m
        hidden = rows * run.seq // (layout.cp * layout.tp) * run.dim * run.dtype.itemsize
        out[("pp", "send")] = m * hidden * ((not first) + (not last))
        out[("pp", "recv")] = 0  # a receive sends nothing: its sender counts the bytes
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
def test_fsdp2_and_pipeline_bytes_sent_are_the_shards_and_activations(recorded, index):
    layout = LAYOUTS[index]
    for rank in range(4):
        sent = recorded[rank][index]["sent"]
        for key, nbytes in expected_sent(rank, layout, GPTRun()).items():
            assert sent[key] == nbytes, (str(layout), rank, key)


def test_wire_bytes_of_a_ring():
    assert wire_bytes("all_gather", 100, 4) == 300 and wire_bytes("reduce_scatter", 400, 4) == 300
    assert wire_bytes("all_reduce", 400, 4) == 600 and wire_bytes("send", 7, 2) == 7 and wire_bytes("recv", 7, 2) == 0


def test_model_state_of_dp_x_cp_ranks_is_the_calculators_zero3_over_dp_x_cp(recorded):
    """FSDP2 over dp x cp (the cp ranks hold the same weights): each rank holds 1/(dp·cp) of every tensor,
    as bytes_per_rank prices ZeRO-3 over dp x cp (float64 here: twice its fp32 bytes)."""
    layout = Layout(dp=2, cp=2)
    want = bytes_per_rank(capstone_shape(GPTRun()), dp=2, cp=2, zero=3, precision="fp32")
    for rank in range(4):
        held = recorded[rank][LAYOUTS.index(layout)]["bytes"]
        assert held["parameters"] == 2 * want["parameters"] and held["gradients"] == 2 * want["gradients"], rank


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
    # Lesson 22's table shows eight of these layouts; its claims, here on all 18.
    rows = {str(lay): layout_row(vars(lay), [results[r][i] for r in range(8)]) for i, lay in enumerate(eight)}
    least = min(row["max bytes/rank"] for row in rows.values())
    fewest = sorted(name for name, row in rows.items() if row["max bytes/rank"] == least)
    assert fewest == sorted(str(lay) for lay in eight if lay.dp * lay.cp == 8)  # FSDP2 over all 8 ranks
    assert max(rows.values(), key=lambda row: sum(row["sent/step"].values()))["layout"] == "cp8"
    flat = [rows[str(lay)]["max activations/rank"] for lay in eight if lay.tp == lay.pp == 1]
    assert max(flat) / min(flat) < 1.05  # 16 tokens per rank in each: dp, cp or both cut activations alike
    assert all(rows[str(lay)]["max activations/rank"] > max(flat) for lay in eight if lay.tp > 1 and lay.pp == 1)
