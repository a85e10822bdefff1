"""FLOPs of a decoder-only transformer, counted from its shape: 6·N·D, and where it is wrong (issue 39).

A training step's *model* FLOPs per token are ``6 N + 12 L s d`` (PaLM, Chowdhery et al. 2022,
appendix B): ``N`` the parameters that multiply (every linear weight, the output head included,
the embedding lookup not), 2 FLOPs per parameter per token forward and 4 backward, plus the
attention scores and their weighting, ``Q K^T`` and ``P V``, which have no parameters: ``4 s d``
per layer per token forward for a sequence of ``s`` (counted over the whole ``s x s`` square, as a
dense kernel computes it; a causal kernel that skips the masked half does half), twice that
backward. Anything a step computes *again* is not model FLOPs: activation recomputation runs the
forward twice, and a flash-attention backward recomputes ``Q K^T`` (``2 L s d`` more per token).
Those count towards the hardware's FLOPs (HFU), never towards MFU.

    >>> shape = TransformerShape(vocab=32, dim=32, layers=2, heads=4, seq=16)
    >>> training_flops(shape, tokens=48).model == 6 * shape.matmul_params * 48 + 12 * 2 * 16 * 32 * 48
    True

``torch.utils.flop_counter.FlopCounterMode`` counts the same from the kernels a step runs; the
tests hold these formulas against it.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["TransformerShape", "StepFlops", "forward_flops", "training_flops", "mfu"]


@dataclass(frozen=True)
class TransformerShape:
    """What a decoder's FLOPs depend on. ``ffn_hidden`` defaults to ``4 dim`` (GPT); ``gated`` is
    SwiGLU's three matrices (Llama) instead of two; ``kv_heads`` below ``heads`` is grouped-query
    attention (smaller ``wk``/``wv``, the same attention FLOPs: every query head still attends)."""

    vocab: int
    dim: int
    layers: int
    heads: int
    seq: int
    kv_heads: int | None = None
    ffn_hidden: int | None = None
    gated: bool = False

    def __post_init__(self) -> None:
        for name in ("vocab", "dim", "layers", "heads", "seq"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.dim % self.heads or self.heads % (self.kv_heads or self.heads):
            raise ValueError(f"dim {self.dim}, heads {self.heads} and kv_heads {self.kv_heads} do not divide evenly")

    @property
    def layer_params(self) -> int:
        """One block's linear weights: q and o (dim x dim), k and v (dim x kv dim), the MLP's matrices."""
        kv_dim = self.dim // self.heads * (self.kv_heads or self.heads)
        hidden = self.ffn_hidden or 4 * self.dim
        return 2 * self.dim * self.dim + 2 * self.dim * kv_dim + (3 if self.gated else 2) * self.dim * hidden

    @property
    def matmul_params(self) -> int:
        """``N`` of ``6 N D``: every block's linear weights and the output head (norms are too few to count)."""
        return self.layers * self.layer_params + self.dim * self.vocab

    @property
    def embedding_params(self) -> int:
        """The token embedding: a lookup, no multiply. Counting it in ``N`` is a classic MFU mistake."""
        return self.vocab * self.dim


@dataclass(frozen=True)
class StepFlops:
    """A step's FLOPs: ``model`` (what MFU counts), ``hardware`` (what the chips ran: HFU), and the
    two parts of ``model``, the weights' matmuls and attention's scores."""

    matmul: int
    attention: int
    hardware: int

    @property
    def model(self) -> int:
        return self.matmul + self.attention


def forward_flops(shape: TransformerShape, tokens: int) -> StepFlops:
    """One forward over ``tokens`` tokens (sequences of ``shape.seq``): ``2 N`` and ``4 L s d`` per token."""
    matmul = 2 * shape.matmul_params * tokens
    attention = 4 * shape.layers * shape.seq * shape.dim * tokens
    return StepFlops(matmul, attention, matmul + attention)


def training_flops(shape: TransformerShape, tokens: int, *, recompute: bool = False,
                   flash_backward: bool = False) -> StepFlops:
    """Forward and backward over ``tokens`` tokens: three forwards' worth of model FLOPs.

    ``recompute``: full activation checkpointing, one more forward on the hardware.
    ``flash_backward``: the attention backward recomputes the scores (``2 L s d`` per token), as
    flash attention's does (and ``FlopCounterMode`` counts).
    """
    forward = forward_flops(shape, tokens)
    hardware = 3 * forward.model + (forward.model if recompute else 0)
    if flash_backward:
        hardware += forward.attention // 2
    return StepFlops(3 * forward.matmul, 3 * forward.attention, hardware)


def mfu(model_flops: float, seconds: float, peak_flops_per_s: float, *, devices: int = 1) -> float:
    """Model FLOPs utilisation: the model FLOPs of the whole job over the time, over the peak of ALL its
    devices (a global token count over one GPU's peak is the mistake that reports MFU above 100%)."""
    if seconds <= 0 or peak_flops_per_s <= 0 or devices < 1:
        raise ValueError(f"seconds, peak and devices must be positive, got {seconds}, {peak_flops_per_s}, {devices}")
    return model_flops / seconds / (peak_flops_per_s * devices)
