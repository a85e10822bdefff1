"""``python -m ddp_tutorial.bench context``: a tiny run is well formed, and its bytes are exact.

Times are reported, never asserted (the machine is shared); the saved bytes per rank are
deterministic: ring attention's exactly its ``seq/N`` positions' q, k, v, output and log-sum-exp.

Covers ``ddp_tutorial.bench.context``.
"""

from __future__ import annotations

import argparse
import json

import pytest

from ddp_tutorial.bench import context

pytestmark = pytest.mark.slow  # make test-slow (CI) runs it; make test leaves it out


@pytest.mark.timeout(120)
def test_tiny_run_saves_one_nth_of_the_bytes_per_rank_and_is_json_clean():
    parser = argparse.ArgumentParser()
    context.add_arguments(parser)
    result = context.run(parser.parse_args(["--seq", "32", "--heads", "2", "--head-dim", "4", "--world-sizes", "2",
                                            "--repeat", "1"]))
    assert [(r["variant"], r["ranks"]) for r in result.rows] == [
        (v, n) for v, _, _ in context.VARIANTS for n in ("SDPA", 2)]
    for row in result.rows:
        if row["ranks"] == 2:
            # q, k, v, out (1 x 2 heads x 16 positions x 4, float32) and lse (1 x 2 x 16) of 16 of the 32 positions
            assert row["saved_KiB"] * 1024 == 4 * (2 * 16 * 4) * 4 + (2 * 16) * 4
            # torch's SDPA saves the same for the whole sequence where it uses its flash kernel on the CPU
            # (out and lse), more where it uses the math path (the probabilities too): at most half
            assert 0 < row["bytes_vs_full"] <= 0.5
            assert row["imbalance"] >= 1 and row["time_ms"] > 0
    json.dumps(result.to_dict())
    assert "ring attention, seq 32" in str(result)
