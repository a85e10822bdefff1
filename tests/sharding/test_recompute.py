"""What checkpointing keeps, followed through backward: ``recompute.peak_during_backward``, ``Recomputed``.

Covers ``ddp_tutorial.sharding.recompute``.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from ddp_tutorial.models import Block
from ddp_tutorial.sharding.activations import block_terms
from ddp_tutorial.sharding.recompute import MODES, Recomputed, held_after_forward, peak_during_backward


class Stack(nn.Module):
    def __init__(self, blocks: nn.ModuleList, how: str):
        super().__init__()
        self.blocks, self.how = blocks, how

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.how == "around the stack":
            return checkpoint(lambda y: [y := block(y) for block in self.blocks][-1], x, use_reentrant=False)
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False) if self.how == "per block" else block(x)
        return x


def test_one_checkpoint_around_the_stack_keeps_least_after_forward_and_most_in_backward():
    b, s, h, a, n = 2, 8, 16, 2, 3
    torch.manual_seed(0)
    blocks = nn.ModuleList(Block(h, a, dropout=0.1, attention="math") for _ in range(n))
    x = torch.randn(b, s, h, requires_grad=True)
    got = {}
    for how in ("plain", "per block", "around the stack"):
        torch.manual_seed(1)
        got[how] = peak_during_backward(Stack(blocks, how), x)
        blocks.zero_grad(set_to_none=True)
        torch.manual_seed(1)
        assert got[how]["after forward"] == held_after_forward(Stack(blocks, how), x), how
    block_input = b * s * h * 4
    one_block = sum(block_terms(b, s, h, a).values())  # everything one block saves (float32, 4-byte masks)
    # x is the caller's: per block keeps the outputs of the first n - 1 blocks; around the stack nothing
    assert got["per block"]["after forward"] == (n - 1) * block_input
    assert got["around the stack"]["after forward"] == 0
    assert got["plain"]["after forward"] == n * one_block - block_input  # x again left out
    # backward around the stack rebuilds all blocks before any gradient: more than the plain loop ever holds
    assert got["around the stack"]["peak"] > got["plain"]["peak"] > got["per block"]["peak"]
    # by more than the slack of one block input that the checker of exercise 17.1 allows
    assert got["around the stack"]["peak"] - got["per block"]["peak"] > block_input


@pytest.mark.parametrize("attention", ["math", "sdpa"])
def test_selective_recomputes_the_attention_core_only_and_survives_a_deepcopy(attention):
    b, s, h, a = 2, 12, 32, 4
    torch.manual_seed(0)
    block = Block(h, a, dropout=0.1 if attention == "math" else 0.0, attention=attention)
    x = torch.randn(b, s, h)
    none = held_after_forward(block, x)
    selective = Recomputed(copy.deepcopy(block), "selective")
    core = sum(v for k, v in block_terms(b, s, h, a, dropout=attention == "math").items() if "(a·s²)" in k) \
        if attention == "math" else 4 * b * a * s  # the fused kernel's log-sum-exp per query and head
    assert held_after_forward(selective, x) == none - core
    copied = copy.deepcopy(selective)  # the checkpointed attend follows the copy, not the original block
    assert copied.block.attend.args[1] is copied.block
    with pytest.raises(ValueError, match="one of"):
        Recomputed(block, "none")
    assert MODES == ("none", "selective", "keep-matmuls", "full")
