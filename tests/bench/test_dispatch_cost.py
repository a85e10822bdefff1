"""``python -m ddp_tutorial.bench experts``: a tiny run, its table consistent with its ratios.

Covers ``ddp_tutorial.bench.dispatch_cost``.
"""

from __future__ import annotations

import argparse
import json

import pytest

from ddp_tutorial.bench import dispatch_cost, subcommand

pytestmark = pytest.mark.slow  # make test-slow (CI) runs it; make test leaves it out


def test_experts_tiny_run_is_consistent():
    assert subcommand("experts") is dispatch_cost
    parser = argparse.ArgumentParser()
    dispatch_cost.add_arguments(parser)
    args = parser.parse_args(["--ranks", "2", "--experts-per-rank", "1", "2", "--tokens", "16", "--dim", "8",
                              "--hidden", "8", "--repeat", "1"])
    result = dispatch_cost.run(args)
    assert [r["experts"] for r in result.rows] == [2, 4]
    for row in result.rows:
        assert row["a2a_ms"] > 0 and row["experts_ms"] > 0
        assert row["a2a_over_compute"] == pytest.approx(row["a2a_ms"] / row["experts_ms"])
        # top-2 of distinct experts: each token leaves for at most 2 experts on the other rank
        assert 0 <= row["rows_out_mean"] <= row["rows_out_max"] <= 2 * 16
        key = f"a2a / experts, {row['experts_per_rank']} expert(s) per rank"
        assert result.ratios[key] == row["a2a_over_compute"]
    dropped = [result.ratios[f"dropped at capacity factor {f:g}"] for f in dispatch_cost.FACTORS]
    assert dropped == sorted(dropped, reverse=True) and dropped[0] > 0 and dropped[-1] < dropped[0]
    json.dumps(result.to_dict(), allow_nan=False)  # what --json writes

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    _, ax = plt.subplots()
    dispatch_cost.plot(result, ax)
    assert len(ax.lines) == 2 and ax.get_xlabel() == "experts per rank"
    plt.close("all")
