"""``ddp_tutorial.performance.timing_plan``: the capstone's layouts that fit, ordered by the step-time model's predicted time.

Every check recomputes what it compares with: the prediction by calling ``stepmodel.predict`` on a
``StepLayout`` built here, the bytes by ``calculator.bytes_per_rank``, Llama 3 405B's shape and Meta's layout
from the paper's tables (written out here), the global batch by arithmetic. The command line runs as a
learner runs it, in a subprocess.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ddp_tutorial.capstone.planning import GIB, candidates, plan_report
from ddp_tutorial.performance.flops import TransformerShape
from ddp_tutorial.performance.hardware import H100
from ddp_tutorial.performance.published import RUNS
from ddp_tutorial.performance.stepmodel import StepLayout, predict
from ddp_tutorial.performance.timing_plan import (
    llama3_405b_report,
    plan_problem,
    published_comparison,
    ranked_layouts,
    timed_report,
)
from ddp_tutorial.sharding.calculator import ModelShape, bytes_per_rank

# Llama 3 405B, Table 3 of the paper, in each module's terms
MEMORY_405B = ModelShape(layers=126, hidden=16384, heads=128, vocab=128256, seq=8192, ffn=53248, kv_heads=8,
                         gated=True, bias=False, rms_norm=True)
FLOPS_405B = TransformerShape(vocab=128256, dim=16384, layers=126, heads=128, kv_heads=8, ffn_hidden=53248,
                              gated=True, seq=8192)
GPUS, SEQ, BATCH_TOKENS = 16384, 8192, 16 * 128 * 8192  # Table 4: 16 sequences per DP, DP 128, 8K tokens
META = (128, 8, 16, 1)  # Table 4: DP, TP, PP, CP on 16,384 GPUs at 8K
LIMIT = 0.9 * 80 * GIB  # the planner's default headroom of 10% on an 80 GiB H100


@pytest.fixture(scope="module")
def ranked():
    return ranked_layouts(MEMORY_405B, gpus=GPUS, hardware=H100, batch_tokens=BATCH_TOKENS, seq=SEQ)


def key(row) -> tuple[int, int, int, int]:
    return (row.layout.dp, row.layout.tp, row.layout.pp, row.layout.cp)


def test_ordered_by_the_step_model_called_directly(ranked):
    assert len(ranked) > 100
    assert plan_problem(gpus=GPUS, batch_tokens=BATCH_TOKENS, seq=SEQ) is None
    times = []
    for row in ranked:
        lay = StepLayout(dp=row.planned.dp, tp=row.planned.tp, pp=row.planned.pp, cp=row.planned.cp, zero=row.planned.zero,
                     sequence_parallel=row.planned.tp > 1, micro_batches=BATCH_TOKENS // SEQ // row.planned.dp,
                     recompute=row.planned.recompute == "full")
        assert row.layout == lay
        step = predict(FLOPS_405B, lay, H100)
        assert row.step == step
        times.append(step.step_s)
    assert times == sorted(times)
    assert times[0] < times[-1]


def test_every_ranked_layout_fits_and_feeds_the_global_batch(ranked):
    for row in ranked:
        lay = row.layout
        total = bytes_per_rank(MEMORY_405B, micro_batch=1, dp=lay.dp, tp=lay.tp, pp=lay.pp, cp=lay.cp,
                               zero=row.planned.zero, recompute=row.planned.recompute)["total"]
        assert total <= LIMIT
        assert lay.dp * lay.tp * lay.pp * lay.cp == GPUS
        assert lay.dp * lay.micro_batches * lay.micro_batch * SEQ == BATCH_TOKENS
        # the bubble the global batch leaves: (pp - 1) / m of a stage's busy time
        busy = row.step.compute_s + row.step.exposed["tp"] + row.step.exposed["ep"] + row.step.exposed["cp"]
        assert row.step.bubble_s == pytest.approx(busy * (lay.pp - 1) / lay.micro_batches)


def test_each_row_names_the_term_it_spends_most_on(ranked):
    for row in ranked[:50] + ranked[-50:]:
        s = row.step
        split = {"compute": s.compute_s, "bubble": s.bubble_s, "exposed TP": s.exposed["tp"],
                 "exposed CP": s.exposed["cp"], "exposed PP": s.exposed["pp"], "exposed DP": s.exposed["dp"],
                 "exposed EP": s.exposed["ep"]}
        assert sum(split.values()) == pytest.approx(s.step_s)
        assert str(row).endswith(f"mostly {max(split, key=split.get)}")
        assert f"MFU {s.mfu:4.0%}" in str(row)


def test_metas_layout_is_a_candidate_and_predicted_as_predict_says(ranked):
    # 126 layers do not split into 16 equal stages: Meta took one layer off the first and the last
    assert META not in candidates(MEMORY_405B, gpus=GPUS)
    assert META in candidates(MEMORY_405B, gpus=GPUS, uneven_stages=True)
    metas = [row for row in ranked if key(row) == META]
    assert metas
    for row in metas:
        lay = StepLayout(dp=128, tp=8, pp=16, zero=row.planned.zero, sequence_parallel=True, micro_batches=16,
                     recompute=row.planned.recompute == "full")
        assert row.step == predict(FLOPS_405B, lay, H100)


def test_the_report_places_meta_among_distinct_layouts_and_says_why(ranked):
    best = {}
    for row in ranked:
        best.setdefault(key(row), row.step.step_s)
    meta_time = best[META]
    place = 1 + sum(t < meta_time for t in best.values())
    first = min(best, key=best.get)
    lines = llama3_405b_report()
    text = "\n".join(lines)
    assert f"ranked {place} of {len(best)} layouts" in text
    first_line = next(line for line in lines if "first choice" in line)
    dp, tp, pp, cp = first
    assert f"dp {dp:>3} tp {tp} pp {pp:>2} cp {cp:>2}" in first_line
    assert "400 TFLOPs/GPU, MFU 41%" in text  # Table 4's row, beside the prediction
    if place > 1:
        fastest = next(r for r in ranked if key(r) == first)
        meta = next(r for r in ranked if key(r) == META)
        assert f"{meta.step.step_s / fastest.step.step_s - 1:.0%} faster by the model" in text
        assert "why:" in text and "blast radius" in text
        if meta.step.bubble_s > fastest.step.bubble_s:
            assert "bubble of (p - 1) / m = 15/16" in text
    else:
        assert "agrees with Meta" in text


def test_comparison_when_meta_leads_or_does_not_fit(ranked):
    run = next(r for r in RUNS if r.model == "Llama 3 405B" and r.gpus == GPUS and r.shape.seq == SEQ)
    only_meta = [row for row in ranked if key(row) == META]
    assert "the model agrees with Meta" in "\n".join(published_comparison(only_meta, run))
    without = [row for row in ranked if key(row) != META]
    assert "does not fit the memory limit here" in "\n".join(published_comparison(without, run))


def test_a_small_problem_ranks_what_the_batch_can_feed():
    shape = ModelShape(layers=32, hidden=4096, heads=32, vocab=128256, seq=4096, ffn=14336, kv_heads=8, gated=True,
                       bias=False, rms_norm=True)
    sequences = 32  # dp 64 cannot split 32 sequences: no row of dp 64
    rows = ranked_layouts(shape, gpus=64, hardware=H100, batch_tokens=sequences * 4096)
    assert rows and all(sequences % r.layout.dp == 0 for r in rows)
    assert {r.layout.dp for r in rows} <= {1, 2, 4, 8, 16, 32}
    lines = timed_report("llama3-8b", gpus=64, batch_tokens=sequences * 4096)
    assert "Meta" not in "\n".join(lines)  # no published run of this problem


@pytest.mark.parametrize("kwargs, words", [
    (dict(gpus=0, batch_tokens=8192, seq=8192), "must be positive, got 0"),
    (dict(gpus=64, batch_tokens=1000, seq=8192), "choose a multiple of 8192"),
    (dict(gpus=64, batch_tokens=8192, seq=8192, gpus_per_node=4), "nodes hold 8 GPUs"),
])
def test_bad_problems_are_named(kwargs, words):
    assert words in plan_problem(**kwargs)
    if "gpus_per_node" not in kwargs:  # the step model's nodes are fixed; the planner is not asked about them
        with pytest.raises(ValueError, match=words):
            ranked_layouts(MEMORY_405B, hardware=H100, **kwargs)


def cli(module: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ))


def test_command_line_ranks_by_time_and_the_memory_plan_is_unchanged():
    timed = cli("ddp_tutorial.performance.timing_plan", "--plan", "llama3-405b", "--gpus", "16384", "--seq", "8192")
    assert timed.returncode == 0, timed.stderr
    assert timed.stdout.splitlines() == llama3_405b_report()
    assert "TP8 PP16 CP1 DP128" in timed.stdout and "first choice" in timed.stdout
    # the capstone's --plan prints bytes only, as before: none of the timed lines
    plain = cli("ddp_tutorial.capstone.rank_memory", "--plan", "llama3-8b", "--gpus", "64")
    assert plain.returncode == 0, plain.stderr
    assert plain.stdout.splitlines() == plan_report("llama3-8b", gpus=64)
    assert not any(word in plain.stdout for word in ("tok/s", "MFU", "ranked", "first choice", "mostly"))


TIMED, MEMORY = "ddp_tutorial.performance.timing_plan", "ddp_tutorial.capstone.rank_memory"


@pytest.mark.parametrize("module, args, words", [
    (TIMED, ("--plan", "llama3-8b", "--batch-tokens", "1000"), "choose a multiple of 4096"),
    (TIMED, ("--plan", "llama3-8b", "--gpus", "0"), "must be positive, got 0"),
    (TIMED, ("--plan", "gpt-5"), "invalid choice: 'gpt-5'"),
    (MEMORY, ("--plan", "llama3-8b", "--gpus", "0"), "--gpus must be at least 1, got 0"),
])
def test_command_line_bad_input_is_one_line_and_exit_2(module, args, words):
    out = cli(module, *args)
    assert out.returncode == 2 and out.stdout == ""
    assert "Traceback" not in out.stderr
    assert words in out.stderr.splitlines()[-1]
    if module == TIMED:  # its parser says one line, without the usage
        assert len(out.stderr.splitlines()) == 1
