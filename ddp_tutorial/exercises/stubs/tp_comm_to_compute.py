"""Exercise 23.6 (medium), lesson 23_how_fast.ipynb: a Megatron layer's TP traffic over its compute, on NVLink.

Write tp_comm_to_compute() below (its docstring is the contract: what must hold), then check it:
    check("tp_comm_to_compute")                                 in the notebook
    python -m ddp_tutorial.exercises check tp_comm_to_compute   from a shell
The checker's ranks read this file afresh each time: an edit counts at once.
Hints, one at a time: python -m ddp_tutorial.exercises show tp_comm_to_compute [--hint 2 .. 3]
Start again from the stub: python -m ddp_tutorial.exercises reset tp_comm_to_compute
"""

from __future__ import annotations


def tp_comm_to_compute(t: int, dim: int, seq: int, *, micro_batch: int, layer_params: int,
                       matmul_flops: float, link_bytes_per_s: float, latency_s: float) -> float:
    """Return the seconds of one layer's TP all-reduces over the seconds of its compute, on one GPU.

    One transformer layer (``layer_params`` weights that multiply, hidden size ``dim``) is split
    over ``t`` GPUs of one node with Megatron's tensor parallelism (no sequence parallelism), and
    runs the forward and the backward of one microbatch of ``micro_batch`` sequences of ``seq``
    tokens, activations in bf16, nothing recomputed. Compute: the layer's model FLOPs (its weights'
    and attention's scores over the whole ``seq x seq`` square, as 23.1 counts them) at
    ``matmul_flops`` FLOP/s. Traffic: the step model's rule (``stepmodel.tp_seconds``): ring
    all-reduces over the ``t`` GPUs on a link of ``link_bytes_per_s`` bytes per second each way,
    each ring step paying ``latency_s``, none hidden behind the compute. 0 at ``t = 1``.
    Pure arithmetic.
    """
    # Your code here; the checker calls tp_comm_to_compute(t, dim, seq, micro_batch, layer_params, matmul_flops, link_bytes_per_s, latency_s) on every rank.
    raise NotImplementedError(
        'exercise 23.6 (tp_comm_to_compute): not started yet, as expected for a fresh stub: '
        'my_exercises/tp_comm_to_compute.py still raises NotImplementedError. Next: write '
        'tp_comm_to_compute() there (its docstring is the contract, lesson 23_how_fast.ipynb '
        "explains it, show('tp_comm_to_compute') gives hints), then check again")
