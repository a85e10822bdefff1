"""Memory-bound kernels: the step's non-matmul work, timed at HBM bandwidth (issue 39, "How fast, and why").

Norms, softmax, activations, residual adds and dropout do a few FLOPs per byte: far below the ridge
point (``roofline``), so they take the time their bytes take to cross HBM, not their FLOPs at the
matmul rate. ``kernel_bytes`` counts, per kernel, the bytes it reads and writes, from the shapes
alone, with ``e`` bytes per activation (2, bf16) and 1 per dropout-mask element (Korthikanti et al.
2022, "Reducing Activation Recomputation in Large Transformer Models", section 4.1: the tensors
each op saves are the ones its backward reads; ``sharding.activations.block_terms`` writes them op
by op). Per token and layer, with ``h`` the width, ``f`` the MLP's hidden width, ``a`` heads, ``s`` the
sequence (attention scores: ``a s`` per token, when they live in HBM):

- **norm** (LayerNorm, RMSNorm), ``h`` elements, 2 per layer: forward reads x, writes y (``2e``); backward
  reads x and dy, writes dx (``3e``);
- **softmax** (scaled, masked), ``a s``: forward scores in, probabilities out (``2e``); backward ``3e``;
- **attention dropout**, ``a s``: forward in, out and the mask (``2e + 1``); backward dy, mask, dx (``2e + 1``);
- **GeLU**, ``f``: ``2e`` forward, ``3e`` backward; **SwiGLU** (gated): gate and up in, one out (``3e``),
  backward gate, up, dy in, two gradients out (``5e``);
- **residual add**, ``h``, 2 per layer: x and the residual in, y out (``3e``); backward the gradients'
  sum (``3e``); with dropout (fused bias + dropout + add) the mask too: ``3e + 1``, and ``2e + 1`` more
  backward.

Kernels as Megatron-LM fuses them (Narayanan et al. 2021, section 4.2: bias + GeLU, bias + dropout +
add, scale + mask + softmax); a flash-attention kernel keeps the scores on chip (no softmax or
attention dropout in HBM). Tensor parallelism splits the ``a s`` and ``f`` kernels by heads and
columns; the ``h`` kernels it leaves whole on every rank unless sequence parallelism splits them
(Korthikanti's ``10 sbh`` term). Left out: the loss's softmax over the vocabulary (once per token,
not per layer), the optimizer step, bias adds fused into matmuls, norms' statistics.
"""

from __future__ import annotations

from dataclasses import dataclass

from ddp_tutorial.performance.flops import TransformerShape
from ddp_tutorial.performance.hardware import Hardware
from ddp_tutorial.performance.steplayout import StepLayout

__all__ = ["Kernels", "Kernel", "layer_kernels", "kernel_bytes", "memory_bound_seconds"]


@dataclass(frozen=True)
class Kernels:
    """Which memory-bound kernels a run has: ``dropout`` (GPT-style training, 0.1 in Megatron-LM),
    ``flash_attention`` (scores never reach HBM), ``act_bytes`` per activation value (2 for bf16)."""

    dropout: bool = True
    flash_attention: bool = False
    act_bytes: int = 2


@dataclass(frozen=True)
class Kernel:
    """One kernel of one layer: ``elements`` per token, ``count`` per layer, bytes per element read and
    written ``forward`` and ``backward``; ``by_heads``: tensor parallelism splits it (else only SP does)."""

    name: str
    elements: int
    count: int
    forward: float
    backward: float
    by_heads: bool


def layer_kernels(shape: TransformerShape, kernels: Kernels) -> list[Kernel]:
    """The table of the module docstring for ``shape``: one layer's memory-bound kernels."""
    e, h, ffn = kernels.act_bytes, shape.dim, shape.ffn_hidden or 4 * shape.dim
    scores = shape.heads * shape.seq
    out = [Kernel("norm", h, 2, 2 * e, 3 * e, False)]
    if not kernels.flash_attention:
        out.append(Kernel("softmax", scores, 1, 2 * e, 3 * e, True))
        if kernels.dropout:
            out.append(Kernel("attention dropout", scores, 1, 2 * e + 1, 2 * e + 1, True))
    out.append(Kernel("SwiGLU", ffn, 1, 3 * e, 5 * e, True) if shape.gated else Kernel("GeLU", ffn, 1, 2 * e, 3 * e, True))
    if kernels.dropout:
        out.append(Kernel("residual + dropout", h, 2, 3 * e + 1, 3 * e + 2 * e + 1, False))
    else:
        out.append(Kernel("residual", h, 2, 3 * e, 3 * e, False))
    return out


def kernel_bytes(shape: TransformerShape, layout: StepLayout, kernels: Kernels) -> dict[str, float]:
    """Bytes each kernel moves on one GPU in one step: its layers (``L / p``), ``m`` microbatches of
    ``b s / cp`` tokens, forward (twice when recomputed) and backward, split ``1/t`` where TP splits it."""
    tokens = layout.micro_batches * layout.micro_batch * shape.seq / layout.cp
    layers = shape.layers / layout.pp
    forwards = 2 if layout.recompute else 1
    out = {}
    for k in layer_kernels(shape, kernels):
        split = layout.tp if k.by_heads or layout.sequence_parallel else 1
        out[k.name] = tokens * layers * k.count * k.elements / split * (forwards * k.forward + k.backward)
    return out


def memory_bound_seconds(shape: TransformerShape, layout: StepLayout, hw: Hardware, kernels: Kernels) -> float:
    """The memory-bound kernels' time on one GPU per step: their bytes over the HBM bandwidth."""
    return sum(kernel_bytes(shape, layout, kernels).values()) / hw.hbm_bytes_per_s
