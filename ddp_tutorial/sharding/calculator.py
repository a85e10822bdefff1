"""The memory calculator: bytes per rank, term by term, for a model shape and a parallel layout.

``bytes_per_rank(shape, micro_batch=..., dp=..., tp=..., pp=..., cp=..., zero=..., recompute=...)``
returns the parameters, gradients, optimizer state and activations one rank holds at the peak
of a step (after forward, before backward frees anything), as ``17_memory`` derives them; later
lessons (ZeRO-3, tensor/sequence/context parallelism, the capstone) call it for their own layouts.

Exact (asserted against bytes measured from real tensors in ``tests/sharding/test_memory_calculator.py``)
for the course's ``models.TinyTransformer`` (``ModelShape.course``) on one process or data-parallel
ranks: parameters, gradients and Adam state under ZeRO 0-3, and activations with
``attention="math"`` for ``recompute`` none, selective (``recompute.keep_matmuls``) and full.
Estimates, from the published formulas and not measured here:

- ``tp > 1``: everything divided by ``tp`` (Megatron with sequence parallelism; the norms'
  replicated weights and the attention heads' rounding ignored);
- ``cp > 1``: tokens divided by ``cp``; the ``a·s²`` terms count local queries against all keys;
- ``pp > 1``: ``layers / pp`` per rank, the first stage holding ``pp`` micro-batches (1F1B);
- Llama-style shapes (``gated``, ``kv_heads``, RMSNorm, ``attention="flash"``): the same
  accounting op by op; a fused kernel may keep less.
- ZeRO shards over ``dp × cp``: the ``cp`` ranks of a replica hold the same weights, so FSDP
  shards over both (torchtitan's ``dp_shard_cp``, the capstone's ``fsdp_mesh``); temporary buffers
  (gathered ZeRO-3 layers, communication buckets, the allocator's fragmentation) are not counted.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, replace

__all__ = ["PRECISIONS", "ModelShape", "PRESETS", "num_params", "activation_terms", "bytes_per_rank", "main"]

# Bytes per parameter (parameter, gradient, optimizer state with Adam) and per activation.
PRECISIONS = {"fp32": (4, 4, 8, 4), "bf16-mixed": (2, 2, 12, 2)}  # ZeRO paper: 2 + 2 + (4 + 4 + 4)


@dataclass(frozen=True)
class ModelShape:
    """A decoder-only transformer: the course's ``Block`` by default, Llama-style with the flags."""

    layers: int
    hidden: int
    heads: int
    vocab: int
    seq: int
    ffn: int = 0  # 0: 4 × hidden
    kv_heads: int = 0  # 0: as many as heads (no grouped-query attention)
    gated: bool = False  # SwiGLU: gate and up projections, then down
    bias: bool = True
    rms_norm: bool = False  # RMSNorm (a weight, one statistic) instead of LayerNorm
    tied: bool = False  # the head shares the embedding's weight

    @property
    def mlp(self) -> int:
        return self.ffn or 4 * self.hidden

    @property
    def kv_dim(self) -> int:
        return (self.kv_heads or self.heads) * (self.hidden // self.heads)

    @classmethod
    def course(cls, vocab: int = 32, dim: int = 16, heads: int = 2, layers: int = 2, seq: int = 8) -> ModelShape:
        """``models.TinyTransformer(vocab, dim, heads, layers)`` on sequences of ``seq`` tokens."""
        return cls(layers=layers, hidden=dim, heads=heads, vocab=vocab, seq=seq)


PRESETS = {
    "tiny": ModelShape.course(),
    "course-small": ModelShape.course(vocab=256, dim=64, heads=4, layers=8, seq=64),
    # Llama 3 8B (8.03e9 parameters), as the Ultra-Scale Playbook prints it
    "llama-8b": ModelShape(layers=32, hidden=4096, heads=32, vocab=128256, seq=4096, ffn=14336, kv_heads=8,
                           gated=True, bias=False, rms_norm=True),
    "llama-70b": ModelShape(layers=80, hidden=8192, heads=64, vocab=128256, seq=4096, ffn=28672, kv_heads=8,
                            gated=True, bias=False, rms_norm=True),
}


def num_params(shape: ModelShape) -> tuple[int, int]:
    """(parameters of one layer, parameters outside the layers: embedding, final norm, head)."""
    h, b = shape.hidden, int(shape.bias)
    norm = h if shape.rms_norm else 2 * h
    attention = h * (h + 2 * shape.kv_dim) + b * (h + 2 * shape.kv_dim) + h * h + b * h
    mlp = (3 if shape.gated else 2) * h * shape.mlp + b * ((2 if shape.gated else 1) * shape.mlp + h)
    outside = shape.vocab * h + norm + (0 if shape.tied else shape.vocab * h + b * shape.vocab)
    return attention + mlp + 2 * norm, outside


def activation_terms(shape: ModelShape, micro_batch: int, *, act_bytes: int = 2, mask_bytes: int | None = None,
                     dropout: bool = False, attention: str = "flash", recompute: str = "none",
                     cp: int = 1) -> dict[str, int]:
    """Bytes one layer saves for backward, by term (``mask_bytes=None``: a dropout mask of ``act_bytes``)."""
    e, m = act_bytes, act_bytes if mask_bytes is None else mask_bytes
    h, f, tokens = shape.hidden, shape.mlp, micro_batch * shape.seq // cp
    th, scores = tokens * h, shape.heads * tokens * shape.seq  # local queries x all keys
    qkv = e * tokens * (h + 2 * shape.kv_dim)
    math_attention = attention == "math"
    if recompute == "full":
        return {"block input": e * th}
    if recompute == "selective":  # the matmuls' outputs; the pointwise ops are recomputed
        mlp_out = (2 if shape.gated else 1) * f
        return {"block input": e * th, "matmul outputs": qkv + e * tokens * (3 * h + mlp_out),
                "scores (a·s²)": e * scores if math_attention else 0}
    terms = {"norm inputs": 2 * e * th, "norm statistics": 2 * (1 if shape.rms_norm else 2) * 4 * tokens,
             "linear inputs": e * tokens * (3 * h + f) if math_attention else e * tokens * (2 * h + f),
             "q, k, v": qkv, "MLP activation": (3 if shape.gated else 1) * e * tokens * f}
    if math_attention:
        terms["softmax (a·s²)"] = e * scores
        if dropout:
            terms["dropout (a·s²)"] = (m + e) * scores  # the mask, and the dropped probabilities probs·v keeps
    else:  # a fused kernel keeps its output and the log-sum-exp per query, never the scores
        terms["attention output, logsumexp"] = e * th + 4 * shape.heads * tokens
    if dropout:
        terms["dropout masks"] = 2 * m * th
    return terms


def bytes_per_rank(shape: ModelShape, *, micro_batch: int = 1, dp: int = 1, tp: int = 1, pp: int = 1,
                   cp: int = 1, zero: int = 0, recompute: str = "none", precision: str = "bf16-mixed",
                   attention: str = "flash", dropout: bool = False, mask_bytes: int | None = None,
                   microbatches: int = 0) -> dict[str, int]:
    """Bytes the busiest rank holds, by term: parameters, gradients, optimizer states, activations, total.

    ``zero``: 0 (DDP), 1 (optimizer state sharded over ``dp × cp``), 2 (+ gradients), 3 (+ parameters).
    ``precision``: "fp32" (4 + 4 + 8 bytes per parameter with Adam) or "bf16-mixed" (2 + 2 + 12).
    ``microbatches`` in flight on the first pipeline stage: 0 means ``pp`` (1F1B).
    The module docstring says which terms are exact and which are estimates.
    """
    if zero not in (0, 1, 2, 3) or recompute not in ("none", "selective", "full"):
        raise ValueError(f"zero must be 0-3 and recompute none/selective/full, got {zero}, {recompute!r}")
    p_bytes, g_bytes, o_bytes, e = PRECISIONS[precision]
    layer, outside = num_params(shape)
    params = math.ceil((layer * math.ceil(shape.layers / pp) + (outside if pp == 1 else outside / 2)) / tp)

    def share(nbytes: int, sharded: bool) -> int:  # over dp x cp: the ranks that hold the same weights
        return -(-nbytes // (dp * cp)) if sharded else nbytes

    per_layer = sum(activation_terms(shape, micro_batch, act_bytes=e, mask_bytes=mask_bytes, dropout=dropout,
                                     attention=attention, recompute=recompute, cp=cp).values())
    tokens = micro_batch * shape.seq // cp
    # after the layers: the final norm's input and statistics, the head's input, the loss's float32
    # log-softmax and its 0-dim total weight
    tail = 2 * e * tokens * shape.hidden + (1 if shape.rms_norm else 2) * 4 * tokens + 4 * tokens * shape.vocab + 4
    in_flight = min(microbatches or pp, pp) if pp > 1 else 1
    activations = math.ceil((per_layer * math.ceil(shape.layers / pp) * in_flight + (tail if pp == 1 else 0)) / tp)
    out = {"parameters": share(params * p_bytes, zero >= 3), "gradients": share(params * g_bytes, zero >= 2),
           "optimizer states": share(params * o_bytes, zero >= 1), "activations": activations}
    return {**out, "total": sum(out.values())}


def gib(nbytes: float) -> str:
    return f"{nbytes / 2**30:.2f}"


def main(argv: list[str] | None = None) -> None:
    """``python -m ddp_tutorial.sharding.calculator --model llama-8b --dp 8 --zero 1 --recompute full``."""
    parser = argparse.ArgumentParser(description="bytes per rank for a model and a parallel layout (17_memory)")
    parser.add_argument("--model", choices=sorted(PRESETS), default="llama-8b")
    parser.add_argument("--seq", type=int, default=0, help="sequence length (0: the preset's)")
    parser.add_argument("--micro-batch", type=int, default=1)
    for name in ("dp", "tp", "pp", "cp"):
        parser.add_argument(f"--{name}", type=int, default=1)
    parser.add_argument("--zero", type=int, default=0, choices=range(4))
    parser.add_argument("--recompute", choices=("none", "selective", "full"), default="none")
    parser.add_argument("--precision", choices=sorted(PRECISIONS), default="bf16-mixed")
    parser.add_argument("--attention", choices=("flash", "math"), default="flash")
    args = parser.parse_args(argv)
    shape = PRESETS[args.model] if not args.seq else replace(PRESETS[args.model], seq=args.seq)
    layer, outside = num_params(shape)
    got = bytes_per_rank(shape, micro_batch=args.micro_batch, dp=args.dp, tp=args.tp, pp=args.pp, cp=args.cp,
                         zero=args.zero, recompute=args.recompute, precision=args.precision,
                         attention=args.attention)
    print(f"{args.model}: {(layer * shape.layers + outside) / 1e9:.2f}e9 parameters, seq {shape.seq}, "
          f"micro-batch {args.micro_batch}, dp {args.dp} tp {args.tp} pp {args.pp} cp {args.cp}, "
          f"ZeRO-{args.zero}, recompute {args.recompute}, {args.precision}")
    for term, nbytes in got.items():
        print(f"  {term:<17} {gib(nbytes):>9} GiB")


if __name__ == "__main__":
    main()
