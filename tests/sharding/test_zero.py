"""ZeRO-1 / ZeRO-2-style from scratch and ZeroRedundancyOptimizer: equal to DDP + Adam, and the bytes they keep.

Covers ``ddp_tutorial.sharding.zero``, ``ddp_tutorial.sharding.memory``,
``ddp_tutorial.plots.sharding``.
"""

from __future__ import annotations

import pytest

from ddp_tutorial.launch import spawn
from ddp_tutorial.models import TinyTransformer
from ddp_tutorial.sharding.memory import Footprint, formula
from ddp_tutorial.sharding.zero import TOLERANCE, greedy_assignment
from tests.sharding.sharding_workers import zero_checks

GB = 10**9


def test_formulas_reproduce_the_zero_paper_figure_1():
    # Rajbhandari et al. 2020, figure 1: 7.5B parameters, 64 GPUs, mixed precision with Adam
    # (2 bytes of fp16 parameters, 2 of fp16 gradients, K = 12 of fp32 copy, momentum, variance)
    psi, n = 7_500_000_000, 64
    got = {s: formula(s, psi, n, param_bytes=2, grad_bytes=2, state_bytes=12).total / GB
           for s in ("DDP", "ZeRO-1", "ZeRO-2", "FSDP2")}
    assert got == pytest.approx({"DDP": 120, "ZeRO-1": 31.4, "ZeRO-2": 16.6, "FSDP2": 1.9}, abs=0.05)


def test_fp32_adam_is_16_bytes_per_parameter_and_shards_divide_by_n():
    assert formula("DDP", 10, 1) == Footprint(40, 40, 80) and formula("DDP", 10, 4) == Footprint(40, 40, 80)
    assert formula("ZeRO-1", 12, 4) == Footprint(48, 48, 24)
    assert formula("ZeRO-2", 12, 4) == Footprint(48, 12, 24)
    assert formula("FSDP2", 12, 4) == Footprint(12, 12, 24)
    assert formula("FSDP2", 10, 4) == Footprint(10, 10, 20)  # 40 / 4, 80 / 4 exactly
    assert formula("FSDP2", 1, 4) == Footprint(1, 1, 2)  # 4 bytes over 4 ranks; 8 / 4


def test_greedy_assignment_is_largest_first_to_the_emptiest_rank():
    assert greedy_assignment([1, 5, 3, 3], 2) == [[1, 0], [2, 3]]  # 5 | 3, 3 | then 1 to the 5: 6 and 6
    assert greedy_assignment([4, 4, 4], 2) == [[0, 2], [1]]  # ties: the lowest rank, and the order kept
    assert greedy_assignment([10, 1, 1, 1], 4) == [[0], [1], [2], [3]]
    assert greedy_assignment([], 3) == [[], [], []]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world_size", [2, 4])
def test_zero_equals_ddp_and_one_process_and_keeps_the_textbook_bytes(world_size):
    results = spawn(zero_checks, world_size, args=((1, 2) if world_size == 2 else (1,),), timeout=100)
    n = world_size
    model = TinyTransformer()
    small = [p.numel() for p in model.parameters()]
    psi = sum(small)  # float32: 4 bytes each
    big = TinyTransformer(vocab=512)
    names = [name for name, _ in big.named_parameters()]
    numels = [p.numel() for p in big.parameters()]
    assignment = greedy_assignment(numels, n)
    for rank, r in enumerate(results):
        for stage, diffs in r["ours"].items():
            assert diffs["DDP"] < TOLERANCE and diffs["one process"] < TOLERANCE, (rank, stage, diffs)
        assert r["torch"]["difference"] < TOLERANCE
        # ZeroRedundancyOptimizer's own choice is the greedy whole-parameter assignment
        assert sorted(r["torch"]["owned"]) == sorted((names[i], numels[i]) for i in assignment[rank])
        assert r["torch"]["state_bytes"] == 2 * 8 * sum(numels[i] for i in assignment[rank])  # 2 float64 states
        b = r["bytes"]
        assert b["DDP"] == Footprint(4 * psi, 4 * psi, 8 * psi)
        assert b["ZeRO-1"] == Footprint(4 * psi, 4 * psi, 8 * psi // n)
        assert b["ZeRO-2"] == Footprint(4 * psi, 4 * psi // n, 8 * psi // n)
        mine = greedy_assignment(small, n)[rank]
        assert b["ZeRO-1 (torch)"] == Footprint(4 * psi, 4 * psi, 8 * sum(small[i] for i in mine))
    if n == 4:  # the large embedding and head cannot be split: some ranks hold more than 1/N
        held = [sum(numels[i] for i in a) for a in assignment]
        assert max(held) > 1.3 * sum(numels) / n and max(held) >= max(numels)

