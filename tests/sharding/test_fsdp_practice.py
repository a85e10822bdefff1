"""FSDP2 in practice (``ddp_tutorial.sharding.fsdp_practice``): meta init, bf16 policy equal to Zero3, accumulation."""

from __future__ import annotations

import pytest
import torch

from ddp_tutorial.launch import spawn
from ddp_tutorial.models import TinyTransformer
from ddp_tutorial.sharding.zero3_train import TOLERANCES
from tests.sharding.sharding_workers import practice_checks


@pytest.mark.slow  # make test stays under 12 minutes; make test-slow and CI run it
@pytest.mark.timeout(150)
def test_fsdp2_in_practice_on_4_ranks():
    for rank, r in enumerate(spawn(practice_checks, 4, timeout=130)):
        # meta init: each rank allocated a quarter of the parameters (TinyTransformer's sizes divide by 4)
        assert r["meta"]["local bytes"] * 4 == r["meta"]["model bytes"] and r["meta"]["equal"], r["meta"]
        # bf16 all-gather and compute, float32 reduce-scatter: the same numbers as Zero3's by hand, bit for bit
        assert r["versus"]["FSDP2 vs Zero3"] == 0, r["versus"]
        assert r["versus"]["FSDP2 vs one process"] <= TOLERANCES[torch.bfloat16], r["versus"]
        assert r["accumulate"]["accumulated"] <= TOLERANCES[None], r["accumulate"]
        # sync off: the whole model's unsharded gradients in reduce_dtype (float32, 4 B per parameter) on every
        # rank until the last micro-batch; sync on: only this rank's float32 shard (TinyTransformer divides by 4)
        numel = sum(p.numel() for p in TinyTransformer().parameters())
        held = r["gradient bytes"]
        assert held["sync off, micro-batch 1"] == 4 * numel, held
        assert held["sync on, micro-batch 1"] == held["sync on, micro-batch 2"] == held["sync off, micro-batch 2"]
        assert held["sync on, micro-batch 1"] == 4 * numel // 4, held
        assert set(r["reshard"]) == {True, False, 2}
        assert all(gap <= TOLERANCES[None] for gap in r["reshard"].values()), r["reshard"]
