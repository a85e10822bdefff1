"""``python -m ddp_tutorial.bench roofline`` and ``stepmodel`` as a learner runs them: exit 0, one row per
operation or layout, the summary line, ``--json`` parseable; an unwritable ``--json`` is one line and exit 2.

Covers ``ddp_tutorial.bench.roofline_bench`` and ``ddp_tutorial.bench.stepmodel_bench``. Measured times and
ratios are this machine's: only their consistency with each other is asserted.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from ddp_tutorial.capstone.layout import layouts
from ddp_tutorial.capstone.reference import GPTRun
from ddp_tutorial.performance.this_machine import LAYOUTS

SUMMARY = re.compile(r"^predicted/measured from (\d+\.\d\d) to (\d+\.\d\d) over 4 layouts on 2 ranks$")


def bench(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ddp_tutorial.bench", *args], capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_bench_stepmodel_prints_a_row_per_layout_and_the_summary_line(tmp_path):
    out = tmp_path / "stepmodel.json"
    done = bench("stepmodel", "--steps", "2", "--batch", "64", "--capstone-steps", "1", "--json", str(out))
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    low, high = map(float, next(SUMMARY.search(line) for line in lines if SUMMARY.search(line)).groups())
    (result,) = json.loads(out.read_text())
    rows, capstone = result["rows"][:len(LAYOUTS)], result["rows"][len(LAYOUTS):]
    assert [r["layout"] for r in rows] == list(LAYOUTS)
    # then every layout of 4 ranks lesson 22 admits, predicted and measured, and their summary line last
    four = [lay for lay in layouts(4, **GPTRun().model_limits()) if lay.world_size == 4]
    assert [r["layout"] for r in capstone] == [f"capstone {lay}" for lay in four]
    assert re.search(rf"capstone predicted/measured from \d+\.\d\d to \d+\.\d\d over {len(four)} layouts of 4 ranks$",
                     lines[-1])
    assert [r["bubble ms"] > 0 for r in capstone] == [lay.pp > 1 for lay in four]
    for row in capstone:
        assert row["predicted ms"] == pytest.approx(row["compute ms"] + row["comm exposed ms"] + row["bubble ms"])
    for row in rows:
        assert row["predicted ms"] == pytest.approx(row["compute ms"] + row["comm exposed ms"] + row["bubble ms"])
        assert row["predicted/measured"] == pytest.approx(row["predicted ms"] / row["measured ms"], abs=0.006)
    assert (low, high) == (min(r["predicted/measured"] for r in rows), max(r["predicted/measured"] for r in rows))
    assert [r["bubble ms"] > 0 for r in rows] == [layout == "PP" for layout in LAYOUTS]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_bench_roofline_places_each_operation_and_writes_json(tmp_path):
    out = tmp_path / "roofline.json"
    done = bench("roofline", "--repeat", "2", "--json", str(out))
    assert done.returncode == 0, done.stderr
    (result,) = json.loads(out.read_text())
    ops = [r["operation"] for r in result["rows"]]
    assert ops == ["linear"] * 4 + ["attention", "layer norm", "all-reduce"]
    ridge = result["ratios"]["ridge FLOPs/byte"]
    assert ridge == pytest.approx(result["ratios"]["achievable matmul GFLOP/s"] / result["ratios"]["copy GB/s"])
    linear = [r["FLOPs/byte"] for r in result["rows"][:4]]
    assert linear == sorted(linear) and linear[0] < 1 < linear[-1]  # intensity grows with the batch
    for row in result["rows"][:-1]:
        if abs(row["FLOPs/byte"] - ridge) > 0.01:  # the printed intensity is rounded to 2 decimals
            assert row["bound"] == ("compute" if row["FLOPs/byte"] > ridge else "memory")
        assert row["attainable GFLOP/s"] <= result["ratios"]["achievable matmul GFLOP/s"] * (1 + 1e-9)
    assert f"ridge point {ridge:.3g} FLOPs/byte" in done.stdout


@pytest.mark.parametrize("command", ["roofline", "stepmodel"])
@pytest.mark.timeout(120)
def test_an_unwritable_json_path_is_one_line_and_exit_2(tmp_path, command):
    done = bench(command, "--json", str(tmp_path / "missing" / "out.json"), timeout=60)
    assert done.returncode == 2 and done.stdout == ""
    (line,) = done.stderr.strip().splitlines()
    assert "--json" in line and "cannot write it" in line and "Traceback" not in done.stderr


@pytest.mark.timeout(120)
def test_a_batch_the_layouts_cannot_split_is_refused_before_any_rank_starts():
    done = bench("stepmodel", "--batch", "12", timeout=60)
    assert done.returncode == 2 and done.stdout == ""
    (line,) = done.stderr.strip().splitlines()
    assert "--batch" in line and "multiple of 8" in line and "got 12" in line


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_the_plans_bytes_are_what_each_layouts_step_hands_to_gloo():
    from ddp_tutorial.bench.stepmodel_bench import recorded_traffic
    from ddp_tutorial.launch import spawn
    from ddp_tutorial.models import DeepMLP
    from ddp_tutorial.performance.this_machine import layout_plan

    batch = 16
    sizes = [(m.in_features, m.out_features) for m in DeepMLP().net if hasattr(m, "in_features")]
    recorded = spawn(recorded_traffic, 2, args=(batch,), backend="gloo", threads=1, timeout=150, quiet=True)
    for layout in LAYOUTS:
        planned = layout_plan(layout, sizes, batch, micro_batches=4).comms
        for rank, seen in enumerate(recorded):
            kinds = {k for k, _, _, _ in planned}
            for kind in kinds:  # the same total per collective: bucketing and per-layer units split it
                assert sum(b for k, b in seen[layout] if k == kind) == \
                    sum(b for k, b, _, _ in planned if k == kind), (layout, rank, kind)
            if layout in ("TP", "PP"):  # one message per planned one, the same sizes
                assert sorted(b for _, b in seen[layout]) == sorted(b for _, b, _, _ in planned), (layout, rank)
            left_out = sum(b for k, b in seen[layout] if k not in kinds)  # DDP's bookkeeping broadcasts
            assert left_out <= 1e-4 * sum(b for _, b, _, _ in planned), (layout, rank)


def test_the_shared_allreduce_timer_reports_the_slowest_rank_on_every_rank():
    # bench roofline's algbw worker times with collective_bw.allreduce_seconds, as bench stepmodel does:
    # one number per run, the slowest rank's, so every rank returns the same
    from ddp_tutorial.bench import roofline_bench, stepmodel_bench
    from ddp_tutorial.bench.collective_bw import allreduce_seconds
    from ddp_tutorial.launch import spawn

    assert stepmodel_bench.allreduce_seconds is allreduce_seconds
    rates = spawn(roofline_bench.allreduce_rate, 3, args=(1 << 16, 2), backend="gloo", threads=1, timeout=90,
                  quiet=True)
    assert len(rates) == 3 and len(set(rates)) == 1 and rates[0] > 0
