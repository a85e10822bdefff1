"""Exercise 23.4 (warm-up), lesson 23_how_fast.ipynb: days to train N parameters on D tokens on G GPUs at a given MFU.

Write days_to_train() below (its docstring is the contract: what must hold), then check it:
    check("days_to_train")                                 in the notebook
    python -m ddp_tutorial.exercises check days_to_train   from a shell
The checker's ranks read this file afresh each time: an edit counts at once.
Hints, one at a time: python -m ddp_tutorial.exercises show days_to_train [--hint 2 .. 2]
Start again from the stub: python -m ddp_tutorial.exercises reset days_to_train
"""

from __future__ import annotations


def days_to_train(matmul_params: float, embedding_params: float, tokens: float, *, gpus: int, mfu: float,
                  peak_flops: float) -> float:
    """Days a training run of ``tokens`` tokens takes on ``gpus`` GPUs, at model FLOPs utilisation ``mfu``.

    The model has ``matmul_params`` weights that multiply (every linear, the output head too) and
    ``embedding_params`` in its token embedding (a lookup). Count a step's model FLOPs as
    ``6 N`` per token, ``N`` the weights that multiply; attention's own FLOPs (the scores, no
    weights) are left out. ``mfu`` (a fraction, 0.4 for 40%) is the model FLOPs per second over
    the dense peak of all the GPUs; ``peak_flops`` is ONE GPU's dense peak, FLOP/s. The run
    recomputes activations, but those are not model FLOPs. Return days (86,400 s), a float.
    """
    # Your code here; the checker calls days_to_train(matmul_params, embedding_params, tokens, gpus, mfu, peak_flops) on every rank.
    raise NotImplementedError(
        'exercise 23.4 (days_to_train): not started yet, as expected for a fresh stub: '
        'my_exercises/days_to_train.py still raises NotImplementedError. Next: write '
        'days_to_train() there (its docstring is the contract, lesson 23_how_fast.ipynb explains '
        "it, show('days_to_train') gives hints), then check again")
