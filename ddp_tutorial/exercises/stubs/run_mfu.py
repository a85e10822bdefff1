"""Exercise 23.1 (medium), lesson 23_how_fast.ipynb: a training run's MFU from what it reports.

Write run_mfu() below (its docstring is the contract: what must hold), then check it:
    check("run_mfu")                                 in the notebook
    python -m ddp_tutorial.exercises check run_mfu   from a shell
The checker's ranks read this file afresh each time: an edit counts at once.
Hints, one at a time: python -m ddp_tutorial.exercises show run_mfu [--hint 2 .. 3]
Start again from the stub: python -m ddp_tutorial.exercises reset run_mfu
"""

from __future__ import annotations

from ddp_tutorial.performance.flops import TransformerShape


def run_mfu(shape: TransformerShape, tokens_per_s: float, gpus: int, *, sheet_flops: float,
            sparse: bool) -> float:
    """Return the run's model FLOPs utilisation, a fraction (0.4, not 40).

    A job of ``gpus`` GPUs trains a decoder of ``shape`` (``ddp_tutorial.performance.flops``;
    sequences of ``shape.seq`` tokens, no sparsity, bf16) at ``tokens_per_s`` tokens per second,
    counted over the whole job. ``sheet_flops`` is the bf16 tensor-core figure of one GPU as its
    data sheet prints it, in FLOP/s; ``sparse`` says whether that figure assumes 2:4 structured
    sparsity. MFU counts the FLOPs the model needs per token (PaLM's definition, appendix B:
    weights and attention scores, forward and backward, nothing computed twice), over the time,
    over the dense peak of all the GPUs. Pure arithmetic.
    """
    # Your code here; the checker calls run_mfu(shape, tokens_per_s, gpus, sheet_flops, sparse) on every rank.
    raise NotImplementedError(
        'exercise 23.1 (run_mfu): not started yet, as expected for a fresh stub: '
        'my_exercises/run_mfu.py still raises NotImplementedError. Next: write run_mfu() there (its'
        " docstring is the contract, lesson 23_how_fast.ipynb explains it, show('run_mfu') gives "
        'hints), then check again')
