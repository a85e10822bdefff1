"""Exercise 23.4, reference solution: how many days a training run takes, from 6·N·D and MFU.

A training step does ``6 N`` FLOPs per token (2 forward, 4 backward, per weight that multiplies),
``N`` without the embedding: a lookup multiplies nothing. ``D`` tokens in all: ``6 N D``. MFU is
the share of the peak those model FLOPs reach, on every GPU: the job runs ``gpus · mfu · peak``
model FLOPs per second. Recomputed activations are hardware FLOPs, not model FLOPs: MFU already
leaves them out, so they never enter the count. A day is 86,400 seconds.
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
    flops = 6 * matmul_params * tokens
    seconds = flops / (gpus * mfu * peak_flops)
    return seconds / 86_400
