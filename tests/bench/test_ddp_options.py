"""ddp_tutorial.bench.ddp_options: the hooks halve the bytes, the gradients stay close, the bucket views share storage."""

from __future__ import annotations

import argparse
import json

import pytest
import torch
import torch.distributed as dist

from ddp_tutorial.bench import ddp_options
from ddp_tutorial.launch import spawn
from ddp_tutorial.models import make_model

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]  # slow: make test-slow (CI) runs it, make test does not


def counted_sizes(rank: int, world_size: int) -> tuple[list[int], list[float]]:
    with ddp_options.counting_all_reduce() as sent:
        t = torch.ones(3, dtype=torch.float16)
        dist.all_reduce(t)
        dist.all_reduce(torch.ones(5))
    dist.all_reduce(torch.ones(7))  # outside the block: not counted, and the real function is back
    return sent, t.tolist()


def test_counting_records_bytes_and_still_reduces():
    for sent, values in spawn(counted_sizes, 2, timeout=60):
        assert sent == [3 * 2, 5 * 4] and values == [2.0] * 3


def test_option_facts_bytes_by_hand_gradients_within_tolerance():
    facts = spawn(ddp_options.option_facts, 2, args=(8,), timeout=200)
    numel = sum(p.numel() for p in make_model("big", 0)[0].parameters())
    for per_rank in facts:
        assert per_rank["default"]["bytes"] == 4 * numel  # float32: every gradient once
        assert per_rank["fp16 hook"]["bytes"] == per_rank["bf16 hook"]["bytes"] == 2 * numel  # half
        assert per_rank["fp16 hook"]["grad_error"] < 1e-3  # 10-bit mantissa: about 5e-4 per rounding
        assert per_rank["bf16 hook"]["grad_error"] < 1e-2  # 7-bit mantissa: about 4e-3
        assert per_rank["gradient_as_bucket_view"]["grad_error"] < 1e-6  # the same sums, no rounding
        assert per_rank["static_graph"]["grad_error"] < 1e-6
        # the views: the gradients live in the buckets (2 of them), not one storage per tensor
        assert per_rank["default"]["storages"] == per_rank["default"]["params"] == 32
        assert 1 < per_rank["gradient_as_bucket_view"]["storages"] < 32
    assert facts[0] == facts[1]


def test_a_tiny_run_is_well_formed_json():
    parser = argparse.ArgumentParser()
    ddp_options.add_arguments(parser)
    result = ddp_options.run(parser.parse_args(["--repeat", "1", "--steps", "1"]))
    assert [r["option"] for r in result.rows] == list(ddp_options.OPTIONS)
    assert result.ratios["fp16 hook bytes / default bytes"] == 0.5
    assert all(r["best ms/step"] > 0 for r in result.rows)
    json.loads(json.dumps(result.to_dict(), allow_nan=False))
