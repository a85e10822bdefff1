"""Exercise 17.1 (warm-up), lesson 17_memory.ipynb: checkpoint every block: keep only the blocks' inputs.

Write checkpointed_forward() below (its docstring is the contract: what must hold), then check it:
    check("checkpointed_forward")                                 in the notebook
    python -m ddp_tutorial.exercises check checkpointed_forward   from a shell
The checker's ranks read this file afresh each time: an edit counts at once.
A hint: python -m ddp_tutorial.exercises show checkpointed_forward
Start again from the stub: python -m ddp_tutorial.exercises reset checkpointed_forward
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
    # Your code here; the checker calls checkpointed_forward(blocks, x) on every rank.
    raise NotImplementedError(
        'exercise 17.1 (checkpointed_forward): not started yet, as expected for a fresh stub: '
        'my_exercises/checkpointed_forward.py still raises NotImplementedError. Next: write '
        'checkpointed_forward() there (its docstring is the contract, lesson 17_memory.ipynb '
        "explains it, show('checkpointed_forward') gives hints), then check again")
