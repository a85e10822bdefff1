"""Exercise 23.7 (medium), lesson 23_how_fast.ipynb: the TP degree past which a layer is communication-bound on NVLink.

Write tp_limit() below (its docstring is the contract: what must hold), then check it:
    check("tp_limit")                                 in the notebook
    python -m ddp_tutorial.exercises check tp_limit   from a shell
The checker's ranks read this file afresh each time: an edit counts at once.
Hints, one at a time: python -m ddp_tutorial.exercises show tp_limit [--hint 2 .. 2]
Start again from the stub: python -m ddp_tutorial.exercises reset tp_limit
"""

from __future__ import annotations


def tp_limit(dim: int, seq: int, heads: int, *, micro_batch: int, layer_params: int, matmul_flops: float,
             link_bytes_per_s: float, latency_s: float) -> int:
    """Return the largest TP degree t for which the layer's TP traffic takes at most its compute.

    The layer, the microbatch and the hardware are 23.6's (``tp_comm_to_compute``: the same
    arguments, the same rule); ``heads`` attention heads. Try t = 1 to 8 (one node: TP stays on its
    NVLink), only those that divide ``heads``; return the largest whose traffic seconds are at most
    its compute seconds (t = 1, with no traffic, always is). Pure arithmetic.
    """
    # Your code here; the checker calls tp_limit(dim, seq, heads, micro_batch, layer_params, matmul_flops, link_bytes_per_s, latency_s) on every rank.
    raise NotImplementedError(
        'exercise 23.7 (tp_limit): not started yet, as expected for a fresh stub: '
        'my_exercises/tp_limit.py still raises NotImplementedError. Next: write tp_limit() there '
        "(its docstring is the contract, lesson 23_how_fast.ipynb explains it, show('tp_limit') "
        'gives hints), then check again')
