"""Exercise 17.1, reference solution: activation checkpointing, one checkpoint per block.

``torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)`` runs ``block(x)`` without
keeping its intermediate tensors for backward; it keeps ``x`` (and the RNG state, so that
dropout draws the same mask again) and, when backward reaches the block, runs its forward
once more to rebuild what it needs. One checkpoint per block, not one around the whole stack:
backward recomputes one block at a time, so at most one block's activations exist at once.
``use_reentrant=False`` is the variant torch recommends (it works with inputs that do not
require grad, with keyword arguments, and with ``torch.autograd.grad``). torch's
``checkpoint_wrapper`` (``torch.distributed.algorithms._checkpoint.checkpoint_wrapper``, what
torchtitan uses) wrapping each block does the same.
"""

from __future__ import annotations

import torch
from torch import nn


def checkpointed_forward(blocks: nn.ModuleList, x: torch.Tensor) -> torch.Tensor:
    """Run ``x`` through every block of ``blocks`` in order, keeping only each block's input for backward.

    The result and, after ``backward()``, every gradient (of ``x`` and of the blocks'
    parameters) must equal those of the plain loop ``for block in blocks: x = block(x)``,
    dropout included. What forward leaves alive for backward must be no more than the
    blocks' inputs (one (batch, seq, hidden) tensor per block), and backward must never hold
    more than one block's rebuilt activations at a time (the checker measures both, in bytes).
    """
    from torch.utils.checkpoint import checkpoint  # here, not at the top: the stub made from this file leaves it to you

    for block in blocks:
        x = checkpoint(block, x, use_reentrant=False)  # keeps x; recomputes block(x) in backward
    return x
