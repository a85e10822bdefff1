"""Exercise 20.2 (hard), lesson 20_long_sequences.ipynb: causal ring attention on the zig-zag layout: the diagonal blocks and the blocks to skip.

Write causal_ring_attention() below (its docstring is the contract: what must hold), then check it:
    check("causal_ring_attention")                                 in the notebook
    python -m ddp_tutorial.exercises check causal_ring_attention   from a shell
The checker's ranks read this file afresh each time: an edit counts at once.
Hints, one at a time: python -m ddp_tutorial.exercises show causal_ring_attention [--hint 2 .. 3]
Start again from the stub: python -m ddp_tutorial.exercises reset causal_ring_attention
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist


def causal_ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal attention (scale ``1/sqrt(head_dim)``) of this rank's queries, the sequence in the zig-zag layout.

    The whole sequence is cut into ``2N`` chunks of ``c`` positions. ``q``, ``k``, ``v``
    ``(batch, heads, 2c, head_dim)`` are this rank's two chunks, ``r`` then ``2N - 1 - r``,
    concatenated along the sequence (the lesson's ``shard_sequence(x, r, N, "zigzag")``). Return this
    rank's rows of ``scaled_dot_product_attention(q, k, v, is_causal=True)`` on the whole sequence,
    in the same order. K/V blocks travel around the ring with point-to-point messages (to
    ``rank + 1``, from ``rank - 1``; ``N - 1`` hops, no collectives). For each pair of a query
    chunk and a key chunk, compute only what the causal mask lets through: no product at all for
    a pair the mask hides entirely, and every product's result merged into the running one with
    the log-sum-exp rule, without ever holding the whole sequence's keys or scores. Scores may be
    large (about 100, in float32): never exponentiate one without subtracting an lse. Leave the
    arguments unchanged. Step by step: ``show("causal_ring_attention", hint=1)``, 2, 3.
    """
    # Your code here; the checker calls causal_ring_attention(q, k, v) on every rank.
    raise NotImplementedError(
        'exercise 20.2 (causal_ring_attention): not started yet, as expected for a fresh stub: '
        'my_exercises/causal_ring_attention.py still raises NotImplementedError. Next: write '
        'causal_ring_attention() there (its docstring is the contract, lesson '
        "20_long_sequences.ipynb explains it, show('causal_ring_attention') gives hints), then "
        'check again')
