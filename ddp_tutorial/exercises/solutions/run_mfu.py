"""Exercise 23.1, reference solution: a training run's MFU from what the run reports.

MFU is the *model* FLOPs the job did per second over the dense peak of *all* its GPUs. A training
step does, per token, ``6 N`` FLOPs for the weights (2 per weight forward, 4 backward: the gradient
of the input and of the weight) plus attention's ``12 L s d`` (``Q K^T`` and ``P V``, ``4 s d`` per
layer forward over the whole ``s x s`` square, three times that with the backward; PaLM, appendix B).
``N`` is every weight that multiplies, ``shape.matmul_params``: the blocks' linears and the output
head, never the embedding, a lookup. Recomputed activations are FLOPs the hardware runs again, not
model FLOPs: they belong to HFU. ``tokens_per_s`` is the whole job's, so the FLOPs it gives are over
``gpus`` GPUs. NVIDIA's headline bf16 figures assume 2:4 structured sparsity, twice the dense peak a
training run can reach: halve such a figure.
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
    flops_per_token = 6 * shape.matmul_params + 12 * shape.layers * shape.seq * shape.dim
    dense_peak = sheet_flops / 2 if sparse else sheet_flops
    return tokens_per_s * flops_per_token / (gpus * dense_peak)
