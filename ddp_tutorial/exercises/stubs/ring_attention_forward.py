"""Exercise 20.1 (hard), lesson 20_long_sequences.ipynb: ring attention's forward: K/V around the ring, the log-sum-exp merge.

Write ring_attention_forward() below (its docstring is the contract: what must hold), then check it:
    check("ring_attention_forward")                                 in the notebook
    python -m ddp_tutorial.exercises check ring_attention_forward   from a shell
The checker's ranks read this file afresh each time: an edit counts at once.
Hints, one at a time: python -m ddp_tutorial.exercises show ring_attention_forward [--hint 2 .. 3]
Start again from the stub: python -m ddp_tutorial.exercises reset ring_attention_forward
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist


def ring_attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Attention (no mask, scale ``1/sqrt(head_dim)``) of this rank's queries with the whole sequence's keys.

    ``q``, ``k``, ``v`` ``(batch, heads, seq/N, head_dim)`` are this rank's contiguous slice of
    the sequence: rank ``r`` holds positions ``r seq/N .. (r+1) seq/N``. Return this rank's rows
    of ``scaled_dot_product_attention`` on the whole sequence, computed block by block: K/V
    blocks passed around the ring with point-to-point messages (to ``rank + 1``, from
    ``rank - 1``; ``N - 1`` hops, no collectives), each block's result merged into the running
    one with the log-sum-exp rule, without ever holding the whole sequence's keys or scores. Scores
    may be large (about 100, in float32): never exponentiate one without subtracting an lse. Leave the
    arguments unchanged. The merge's formulas, step by step: ``show("ring_attention_forward", hint=1)``, 2, 3.
    """
    # Your code here; the checker calls ring_attention_forward(q, k, v) on every rank.
    raise NotImplementedError(
        'exercise 20.1 (ring_attention_forward): not started yet, as expected for a fresh stub: '
        'my_exercises/ring_attention_forward.py still raises NotImplementedError. Next: write '
        'ring_attention_forward() there (its docstring is the contract, lesson '
        "20_long_sequences.ipynb explains it, show('ring_attention_forward') gives hints), then "
        'check again')
