"""``bench memory``: a tiny run whose every predicted byte equals the measured one; its plot draws.

Covers ``ddp_tutorial.bench.activation_memory``.
"""

from __future__ import annotations

import argparse
import json

import pytest

from ddp_tutorial.bench import activation_memory

pytestmark = pytest.mark.slow  # make test-slow (CI) runs it; make test leaves it out


@pytest.mark.timeout(180)
def test_memory_tiny_run_predicts_every_byte(tmp_path):
    parser = argparse.ArgumentParser()
    activation_memory.add_arguments(parser)
    args = parser.parse_args(["--vocab", "32", "--dim", "16", "--heads", "2", "--layers", "2", "--seq", "8",
                              "--batch", "2"])
    result = activation_memory.run(args)
    assert len(result.rows) == 5 + 4 * 3  # 4 recompute modes + sdpa, 4 strategies x 3 model-state terms
    assert all(row["predicted"] == row["measured"] for row in result.rows), result
    assert result.ratios["worst measured / predicted"] == 1.0 and "met" in result.notes[0]
    assert result.ratios["full checkpointing: activation bytes / none's"] < \
        result.ratios["keep-matmuls checkpointing: activation bytes / none's"] < 1
    assert result.ratios["selective checkpointing: activation bytes / none's"] < 1
    assert result.ratios["keep-matmuls checkpointing: FLOPs / none's"] == 1.0
    assert 1 < result.ratios["selective checkpointing: FLOPs / none's"] < result.ratios["full checkpointing: FLOPs / none's"]
    assert 1 < result.ratios["full checkpointing: FLOPs / none's"] <= 4 / 3
    json.dumps(result.to_dict())
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    activation_memory.plot(result, ax)
    fig.savefig(tmp_path / "memory.png")
    assert (tmp_path / "memory.png").stat().st_size > 0
