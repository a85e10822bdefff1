"""``ddp_tutorial.capstone.rank_memory`` and ``ddp_tutorial.capstone.planning``: each rank's bytes against the memory calculator.

One 4-rank launch measures four layouts. Parameters, gradients and Adam's moments are checked
against the one-process model's tensors, counted by name (which stage holds each, which are
replicated over ``tp``); activations against ``sharding.activations.saved_tensors`` on one
process; then measured = calculator + ``formula_gap`` to the byte: exact (gap 0) where the
calculator claims it (data-parallel ranks, FSDP2 as ZeRO-3); ``make capstone-layouts``
(``DDP_TUTORIAL_ALL_LAYOUTS=1``) checks every layout of 8 ranks the same way. The planner's rules are checked on
numbers computed by hand from the published formulas.
"""

from __future__ import annotations

import os

import pytest
import torch

from ddp_tutorial.capstone.chars import char_batch
from ddp_tutorial.capstone.layout import Layout, coordinates, layouts
from ddp_tutorial.capstone.parallelize import stage_layers
from ddp_tutorial.capstone.planning import GIB, PLAN_MODELS, candidates, fitting_layouts, layout_table
from ddp_tutorial.capstone.rank_memory import TERMS, capstone_shape, formula_gap, memory_runs, micro_batch, predict
from ddp_tutorial.capstone.reference import GPTRun, make_gpt, next_char_loss
from ddp_tutorial.launch import spawn
from ddp_tutorial.sharding.activations import saved_tensors
from ddp_tutorial.sharding.calculator import bytes_per_rank

RUN = GPTRun(dtype=torch.float32)
LAYOUTS = [Layout(dp=4), Layout(dp=2, tp=2), Layout(dp=2, pp=2), Layout(tp=2, pp=2)]


@pytest.fixture(scope="module")
def measured() -> list:
    # gloo (CPU) on any machine: the activation gaps are stated for torch's CPU attention kernel
    return spawn(memory_runs, 4, args=([vars(lay) for lay in LAYOUTS],), backend="gloo", timeout=240)


def held_by_names(layout: Layout, rank: int) -> int:
    """Parameter bytes this rank must hold, from the one-process model's tensors: its stage's, a tp share
    of each except the norms (replicated over tp), a dp share of that."""
    stage = coordinates(rank, layout)["pp"]
    blocks = {f"layers.{i}." for i in stage_layers(RUN.layers, stage, layout.pp)}
    first, last = stage == 0, stage == layout.pp - 1
    total = 0
    for name, p in make_gpt(RUN).named_parameters():
        here = (name.startswith(tuple(blocks)) or (first and name.startswith("tok_embeddings"))
                or (last and name.startswith(("norm.", "output."))))
        if here:
            total += p.numel() * p.element_size() // (1 if "norm" in name else layout.tp)
    return total // layout.dp


@pytest.mark.parametrize("index", range(len(LAYOUTS)))
def test_model_state_is_the_real_shards(measured, index):
    layout = LAYOUTS[index]
    for rank in range(4):
        got = measured[rank][index]["measured"]
        assert got["parameters"] == held_by_names(layout, rank), (str(layout), rank)
        assert got["optimizer states"] == 2 * got["parameters"]  # Adam's two moments, shaped like the shard


def test_the_calculator_is_exact_on_data_parallel_ranks(measured):
    """FSDP2 is ZeRO-3: a calculator that did not shard a term over dp would predict 4 times the bytes."""
    index = LAYOUTS.index(Layout(dp=4))
    for rank in range(4):
        facts = measured[rank][index]
        assert all(facts["measured"][t] == facts["predicted"][t] for t in ("parameters", "gradients",
                                                                           "optimizer states")), rank
        assert facts["predicted"]["parameters"] * 4 == bytes_per_rank(capstone_shape(RUN), precision="fp32")["parameters"]


def test_activations_of_a_data_parallel_rank_equal_one_process_on_its_rows(measured):
    """The recorder under FSDP2 (gathered weights left out) against sharding.activations on one process."""
    index = LAYOUTS.index(Layout(dp=4))
    model = make_gpt(RUN)
    rows = micro_batch(RUN, Layout(dp=4))
    for rank in range(4):
        inputs, targets = char_batch(1, RUN.global_batch, RUN.seq, part=rank, parts=4, seed=RUN.seed)
        with saved_tensors(model) as record:
            next_char_loss(model(inputs.contiguous()), targets)
        assert inputs.shape[0] == rows and measured[rank][index]["measured"]["activations"] == record.total


@pytest.mark.parametrize("index", range(len(LAYOUTS)))
def test_measured_is_the_calculator_plus_the_stated_gap(measured, index):
    layout = LAYOUTS[index]
    for rank in range(4):
        facts = measured[rank][index]
        gap = formula_gap(RUN, layout, facts["stage"])
        assert facts["predicted"] == {t: v for t, v in predict(RUN, layout).items() if t in TERMS}
        for term in TERMS:
            assert facts["measured"][term] == facts["predicted"][term] + gap[term], (str(layout), rank, term)
    if layout.tp == layout.pp == 1:
        assert all(v == 0 for t, v in gap.items() if t != "activations")  # where the calculator claims exact


# ------------------------------------------------------------------ choosing a layout

PSI_8B = 8_030_261_248  # Llama 3 8B's parameters, as Meta publishes them


def test_candidates_keep_tp_in_a_node_and_pipeline_stages_on_whole_nodes():
    for gpus in (8, 16, 64):
        rows = candidates(PLAN_MODELS["llama3-70b"], gpus=gpus, gpus_per_node=8)
        assert rows and all(dp * tp * pp * cp == gpus for dp, tp, pp, cp in rows)
        assert all(tp <= 8 and 8 % tp == 0 for _, tp, _, _ in rows)
        assert all(pp == 1 or (gpus // pp) % 8 == 0 for _, _, pp, _ in rows)
    assert {pp for _, _, pp, _ in candidates(PLAN_MODELS["llama3-8b"], gpus=8)} == {1}  # one node: no pipeline


def test_model_states_by_hand_the_zero_paper():
    """bf16 mixed precision with Adam: 2 + 2 + 12 bytes per parameter, ZeRO-1 shards the 12, ZeRO-3 all 16."""
    shape = PLAN_MODELS["llama3-8b"]
    one = bytes_per_rank(shape, dp=64, zero=1)
    assert one["parameters"] + one["gradients"] == 4 * PSI_8B
    assert one["optimizer states"] == -(-12 * PSI_8B // 64)
    three = bytes_per_rank(shape, dp=64, zero=3)
    assert abs(three["parameters"] + three["gradients"] + three["optimizer states"] - 16 * PSI_8B / 64) <= 3
    # full recomputation keeps each layer's input: 2 bytes x seq x hidden per layer (Korthikanti et al.)
    full = bytes_per_rank(shape, recompute="full")["activations"]
    tail = 2 * 2 * 4096 * 4096 + 4 * 4096 + 4 * 4096 * 128256 + 4  # final norm and head inputs, stats, fp32 log-softmax
    assert full == 32 * 2 * 4096 * 4096 + tail


def test_llama3_8b_on_8_nodes_is_pure_data_parallel():
    """States 16·Ψ with ZeRO-1 over 64: (4 + 12/64)·Ψ = 31.3 GiB, room left for the activations."""
    best = fitting_layouts(PLAN_MODELS["llama3-8b"], gpus=64, gpu_bytes=80 * GIB)[0]
    assert (best.dp, best.tp, best.pp, best.cp, best.zero, best.recompute) == (64, 1, 1, 1, 1, "none")
    assert best.bytes > (4 + 12 / 64) * PSI_8B


def test_llama3_70b_does_not_fit_one_node():
    """ZeRO-3 over 8 GPUs leaves 16·Ψ/8 > 140 GB of states per GPU, whatever tp: more nodes are needed."""
    shape = PLAN_MODELS["llama3-70b"]
    assert 16 * 70e9 / 8 > 80 * GIB
    assert not fitting_layouts(shape, gpus=8, gpu_bytes=80 * GIB)
    assert fitting_layouts(shape, gpus=64, gpu_bytes=80 * GIB)


def test_long_sequences_call_for_context_parallelism():
    """At 128k tokens no cp = 1 layout fits without recomputation: tp ≤ 8 alone leaves, per GPU, the MLP's
    three saved (T, ffn) tensors of 32 layers, 3·2·131072·14336·32 / 8 bytes = 42 GiB, before anything else."""
    shape, seq = PLAN_MODELS["llama3-8b"], 131072
    assert 3 * 2 * seq * 14336 * 32 / 8 > 40 * GIB
    rows = fitting_layouts(shape, gpus=64, gpu_bytes=80 * GIB, seq=seq)
    assert not [r for r in rows if r.cp == 1 and r.recompute == "none"]
    assert rows[0].cp > 1 and rows[0].recompute == "none" and rows[0].pp == 1
    short = layout_table(shape, gpus=64, gpu_bytes=80 * GIB)
    # At 4k tokens the weights decide: every ZeRO-3 layout sharded over 8 ranks or more fits with full
    # recomputation; ZeRO shards over dp x cp, so cp 64 x dp 1 holds 16·Ψ/64 of model state, as dp 64 does
    assert all(r.fits for r in short if r.zero == 3 and r.recompute == "full" and r.dp * r.cp >= 8)
    cp64 = [r for r in short if r.dp == 1 and r.cp == 64 and r.zero == 3 and r.recompute == "full"]
    assert cp64 and cp64[0].fits and 16 * PSI_8B / 64 < cp64[0].bytes < 16 * PSI_8B / 64 + 2 * GIB


def test_llama3_70b_at_128k_fits_with_cp_once_zero_shards_over_dp_x_cp():
    """70B at 128k tokens on 64 GPUs: FSDP over dp x cp x tp = 64 ranks leaves 16·Ψ/64 of model state
    (Ψ = 70.6e9: 17.6 GB), so tp8 x cp8 fits without recomputation."""
    best = fitting_layouts(PLAN_MODELS["llama3-70b"], gpus=64, gpu_bytes=80 * GIB, seq=131072)[0]
    assert (best.tp, best.cp, best.pp, best.recompute, best.zero) == (8, 8, 1, "none", 3)
    state = bytes_per_rank(PLAN_MODELS["llama3-70b"], tp=8, cp=8, zero=3)  # model state: seq plays no part
    state = state["total"] - state["activations"]
    assert abs(state - 16 * 70.6e9 / 64) < 0.01 * 16 * 70.6e9 / 64


@pytest.mark.skipif(os.environ.get("DDP_TUTORIAL_ALL_LAYOUTS") != "1",
                    reason="every layout of 8 ranks: make capstone-layouts (DDP_TUTORIAL_ALL_LAYOUTS=1)")
def test_every_layout_of_8_ranks_is_the_calculator_plus_the_stated_gap():
    eight = [lay for lay in layouts(8, **RUN.model_limits()) if lay.world_size == 8 and lay.cp == 1]
    results = spawn(memory_runs, 8, args=([vars(lay) for lay in eight],), backend="gloo", timeout=600)
    for index, layout in enumerate(eight):
        for rank in range(8):
            facts = results[rank][index]
            assert facts["measured"]["parameters"] == held_by_names(layout, rank), (str(layout), rank)
            gap = formula_gap(RUN, layout, facts["stage"])
            assert all(facts["measured"][t] == facts["predicted"][t] + gap[t] for t in TERMS), (str(layout), rank)
