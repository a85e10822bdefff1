"""FSDP2 in practice (``ddp_tutorial.sharding.fsdp_practice``): meta init, bf16 policy equal to Zero3, accumulation."""

from __future__ import annotations

import pytest
import torch

from ddp_tutorial.launch import spawn
from ddp_tutorial.sharding.zero3_train import TOLERANCES
from tests.sharding.sharding_workers import practice_checks


@pytest.mark.timeout(150)
def test_fsdp2_in_practice_on_4_ranks():
    for rank, r in enumerate(spawn(practice_checks, 4, timeout=130)):
        # meta init: each rank allocated a quarter of the parameters (TinyTransformer's sizes divide by 4)
        assert r["meta"]["local bytes"] * 4 == r["meta"]["model bytes"] and r["meta"]["equal"], r["meta"]
        # bf16 all-gather and compute, float32 reduce-scatter: the same numbers as Zero3's by hand, bit for bit
        assert r["versus"]["FSDP2 vs Zero3"] == 0, r["versus"]
        assert r["versus"]["FSDP2 vs one process"] <= TOLERANCES[torch.bfloat16], r["versus"]
        assert r["accumulate"]["accumulated"] <= TOLERANCES[None], r["accumulate"]
        assert set(r["reshard"]) == {True, False, 2}
        assert all(gap <= TOLERANCES[None] for gap in r["reshard"].values()), r["reshard"]
