"""The published runs are transcribed faithfully, and ``bench published`` reports them (issue 39):
``ddp_tutorial.performance.published`` and ``ddp_tutorial.bench.published_runs``.

No test holds a prediction against a published figure: that comparison is what the bench prints."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from ddp_tutorial.performance.published import LLAMA3, MEGATRON, RUNS

PUBLISHED_LINE = re.compile(r"^(\d+) of (\d+) published runs predicted within 20%$")


def test_enough_runs_from_enough_sources():
    assert len(RUNS) >= 8 and {r.source for r in RUNS} == {LLAMA3, MEGATRON}


@pytest.mark.parametrize("run", RUNS, ids=lambda r: f"{r.model}-{r.gpus}-{r.shape.seq}")
def test_mfu_is_tflops_over_the_peak_within_rounding(run):
    # MFU printed to a whole percent (0.5 points), TFLOPs to tflops_step (Llama 3: tens, half of it off at most)
    tolerance = 0.005 + run.tflops_step / 2 * 1e12 / run.hardware.peak_flops
    assert abs(run.mfu - run.tflops_per_gpu * 1e12 / run.hardware.peak_flops) <= tolerance


def test_llama3_rows_hold_16m_tokens_per_batch():
    # Table 4: "Tokens/Batch 16M" for each row = DP x batch size per DP x sequence length
    for run in (r for r in RUNS if r.source == LLAMA3):
        assert run.layout.dp * run.layout.micro_batches * run.shape.seq == 16 * 2 ** 20


def test_megatron_rows_have_the_parameters_of_their_shape():
    # Narayanan et al. 2021, eq. 2: P = 12 l h^2 (1 + 13 / (12 h) + (V + s) / (12 l h)), printed to 0.1B
    for run in (r for r in RUNS if r.source == MEGATRON):
        layers, h, v, s = run.shape.layers, run.shape.dim, run.shape.vocab, run.shape.seq
        params = 12 * layers * h * h * (1 + 13 / (12 * h) + (v + s) / (12 * layers * h))
        printed = float(run.model.split()[1].rstrip("B"))
        assert abs(params / 1e9 - printed) <= 0.06 + printed * 1e-3, run.model


def bench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ddp_tutorial.bench", "published", *args],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.timeout(150)
def test_bench_published_prints_a_row_per_run_and_the_summary_line(tmp_path):
    out = tmp_path / "published.json"
    done = bench("--json", str(out))
    assert done.returncode == 0, done.stderr
    last = [line for line in done.stdout.splitlines() if line.strip()][-1]
    hits, total = map(int, PUBLISHED_LINE.match(last).groups())
    assert total == len(RUNS) and 0 <= hits <= total
    (result,) = json.loads(out.read_text())
    assert [r["model"] for r in result["rows"]] == [r.model for r in RUNS]
    for row in result["rows"]:
        assert row["predicted/published"] == pytest.approx(row["predicted TFLOPs"] / row["published TFLOPs"], abs=0.01)
        assert bool(row["left out"]) == (abs(row["predicted/published"] - 1) > 0.2)
    assert hits == sum(1 for r in result["rows"] if not r["left out"])


@pytest.mark.timeout(150)
def test_bench_published_refuses_an_unwritable_json_path(tmp_path):
    done = bench("--json", str(tmp_path / "missing" / "out.json"))
    assert done.returncode == 2 and done.stdout == ""
    (line,) = done.stderr.strip().splitlines()
    assert "--json" in line and "cannot write it" in line and "Traceback" not in done.stderr
