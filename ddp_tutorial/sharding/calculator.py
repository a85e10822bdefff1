"""The memory calculator: bytes per rank, term by term, for a model shape and a parallel layout.

``bytes_per_rank(shape, micro_batch=..., dp=..., tp=..., pp=..., cp=..., zero=..., recompute=...)``
returns the parameters, gradients, optimizer state and the activations one rank holds when
forward has ended (what backward will need), as ``17_memory`` derives them; later lessons
(ZeRO-3, tensor/sequence/context parallelism, the capstone) call it for their own layouts. It
is not the peak of a step: that comes early in backward, when the loss's gradients (the size of
the logits, and of the float32 log-probabilities) and, with recomputation, one rebuilt layer
exist on top of these; temporary buffers (gathered ZeRO-3 layers, communication buckets, the
allocator's rounding and fragmentation) are not counted either.

Exact (asserted against bytes measured from real tensors in ``tests/sharding/test_memory_calculator.py``)
for the course's ``models.TinyTransformer`` (``ModelShape.course``) on one process or data-parallel
ranks: parameters, gradients and Adam state under ZeRO 0-3, and activations with
``attention="math"`` for each ``recompute.MODES``: none, selective (Korthikanti et al.'s: the
attention core recomputed), keep-matmuls (this course's ``recompute.keep_matmuls``) and full.
Estimates, from the published formulas and not measured here:

- ``tp > 1``: with ``sp=True`` (sequence parallelism, the default) everything divided by ``tp``;
  with ``sp=False`` the norms' and dropouts' activations and the inputs of the qkv and MLP
  linears stay whole on every rank: Korthikanti et al. (2022) Table 2, ``korthikanti`` (the
  norms' replicated weights and the attention heads' rounding ignored);
- ``cp > 1``: tokens divided by ``cp``; the ``a·s²`` terms count local queries against all keys;
- ``pp > 1``: ``layers / pp`` per rank, the first stage holding ``pp`` micro-batches (1F1B);
- Llama-style shapes (``gated``, ``kv_heads``, RMSNorm, ``attention="flash"``): the same
  accounting op by op; a fused kernel may keep less.
- ZeRO shards over ``dp × cp``: the ``cp`` ranks of a replica hold the same weights, so FSDP
  shards over both (torchtitan's ``dp_shard_cp``, the capstone's ``fsdp_mesh``).

The activations' dtype is one for all (``PRECISIONS``' last number): a model run wholly in bf16
(Megatron, FSDP2's ``param_dtype=bf16``). ``torch.autocast`` keeps the residual stream, and so
the norms' inputs, in float32: 2·2·s·b·h bytes more per layer (``17_memory`` §2 measures it).
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, replace

__all__ = ["PRECISIONS", "RECOMPUTE", "WHOLE_WITHOUT_SP", "ModelShape", "PRESETS", "num_params", "korthikanti",
           "activation_terms", "bytes_per_rank", "main"]

# Bytes per parameter (parameter, gradient, optimizer state with Adam) and per activation, as each stack holds them.
PRECISIONS = {
    "fp32": (4, 4, 8, 4),
    "bf16-mixed": (2, 2, 12, 2),  # the ZeRO paper's minimum (§3.1): bf16 weights and grads; fp32 masters, Adam 4 + 4
    "megatron-bf16": (2, 4, 12, 2),  # Megatron-LM: gradients accumulated in fp32 main_grad buffers
    # FSDP2, MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32): the fp32 shards are the masters, grads fp32;
    # the bf16 weights exist only while a layer is gathered (torch/distributed/fsdp/_fully_shard/_fsdp_api.py)
    "fsdp2-bf16": (4, 4, 8, 2),
}
RECOMPUTE = ("none", "selective", "keep-matmuls", "full")  # recompute.MODES, without importing torch
# The terms tensor parallelism without sequence parallelism leaves whole on every rank (Korthikanti et al. §4.2.2)
WHOLE_WITHOUT_SP = ("norm inputs", "norm statistics", "qkv and MLP inputs", "dropout masks", "block input")


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


def korthikanti(seq: int, batch: int, hidden: int, heads: int, *, tp: int = 1, sp: bool = False,
                recompute: str = "none") -> float:
    """Activation bytes per layer and per rank, Korthikanti et al. (2022) Table 2 (16-bit, 1-byte dropout masks).

    ``sbh(34 + 5as/h)`` without parallelism; tensor parallel ``sbh(10 + 24/t + 5as/(ht))``; with
    sequence parallelism ``sbh(34/t + 5as/(ht))``; selective recomputation drops the ``5as/(ht)``
    term; full recomputation keeps the layer's input, ``2sbh`` (the paper writes it undivided by t).
    """
    sbh, attention = seq * batch * hidden, 5 * heads * seq / (hidden * tp)
    if recompute == "full":
        return 2 * sbh
    if recompute not in ("none", "selective"):
        raise ValueError(f"Table 2 has recompute none, selective and full, not {recompute!r}")
    kept = 34 / tp if sp or tp == 1 else 10 + 24 / tp
    return sbh * (kept + (attention if recompute == "none" else 0))


def activation_terms(shape: ModelShape, micro_batch: int, *, act_bytes: int = 2, mask_bytes: int | None = None,
                     dropout: bool = False, attention: str = "flash", recompute: str = "none",
                     cp: int = 1) -> dict[str, int]:
    """Bytes one layer saves for backward, by term (``mask_bytes=None``: a dropout mask of ``act_bytes``).

    ``recompute`` (``RECOMPUTE``): "selective" drops what the attention core keeps (the ``a·s²``
    terms, or a fused kernel's log-sum-exp); "keep-matmuls" keeps the block's input and the
    matmuls' outputs; "full" the block's input.
    """
    e, m = act_bytes, act_bytes if mask_bytes is None else mask_bytes
    h, f, tokens = shape.hidden, shape.mlp, micro_batch * shape.seq // cp
    th, scores = tokens * h, shape.heads * tokens * shape.seq  # local queries x all keys
    qkv = e * tokens * (h + 2 * shape.kv_dim)
    math_attention = attention == "math"
    if recompute == "full":
        return {"block input": e * th}
    if recompute == "keep-matmuls":  # the matmuls' outputs; the pointwise ops are recomputed
        mlp_out = (2 if shape.gated else 1) * f
        return {"block input": e * th, "matmul outputs": qkv + e * tokens * (3 * h + mlp_out),
                "scores (a·s²)": e * scores if math_attention else 0}
    terms = {"norm inputs": 2 * e * th, "norm statistics": 2 * (1 if shape.rms_norm else 2) * 4 * tokens,
             "qkv and MLP inputs": 2 * e * th,  # gate and up read one input
             "proj and down inputs": e * tokens * (h + f) if math_attention else e * tokens * f,
             "q, k, v": qkv, "MLP activation": (3 if shape.gated else 1) * e * tokens * f}
    core = recompute != "selective"  # selective: what only the attention core keeps is recomputed
    if math_attention:
        terms["softmax (a·s²)"] = e * scores * core
        if dropout:
            terms["dropout (a·s²)"] = (m + e) * scores * core  # the mask, and the dropped probabilities probs·v keeps
    else:  # a fused kernel keeps its output (proj's input) and the log-sum-exp per query, never the scores
        terms["attention output, logsumexp"] = e * th + 4 * shape.heads * tokens * core
    if dropout:
        terms["dropout masks"] = 2 * m * th
    return terms


def bytes_per_rank(shape: ModelShape, *, micro_batch: int = 1, dp: int = 1, tp: int = 1, pp: int = 1,
                   cp: int = 1, zero: int = 0, recompute: str = "none", precision: str = "bf16-mixed",
                   attention: str = "flash", dropout: bool = False, mask_bytes: int | None = None,
                   microbatches: int = 0, sp: bool = True) -> dict[str, int]:
    """Bytes the busiest rank holds when forward ends, by term: parameters, gradients, optimizer states,
    activations, total.

    ``zero``: 0 (DDP), 1 (optimizer state sharded over ``dp × cp``), 2 (+ gradients), 3 (+ parameters).
    ``precision``: a layout of ``PRECISIONS``: "fp32" (4 + 4 + 8 bytes per parameter with Adam),
    "bf16-mixed" (the ZeRO paper's 2 + 2 + 12), "megatron-bf16" (2 + 4 + 12), "fsdp2-bf16" (4 + 4 + 8).
    ``recompute``: one of ``RECOMPUTE``. ``sp``: sequence parallelism with ``tp``.
    ``microbatches`` in flight on the first pipeline stage: 0 means ``pp`` (1F1B).
    The module docstring says which terms are exact and which are estimates.
    """
    if zero not in (0, 1, 2, 3) or recompute not in RECOMPUTE:
        raise ValueError(f"zero must be 0-3 and recompute one of {RECOMPUTE}, got {zero}, {recompute!r}")
    p_bytes, g_bytes, o_bytes, e = PRECISIONS[precision]
    layer, outside = num_params(shape)
    params = math.ceil((layer * math.ceil(shape.layers / pp) + (outside if pp == 1 else outside / 2)) / tp)

    def share(nbytes: int, sharded: bool) -> int:  # over dp x cp: the ranks that hold the same weights
        return -(-nbytes // (dp * cp)) if sharded else nbytes

    terms = activation_terms(shape, micro_batch, act_bytes=e, mask_bytes=mask_bytes, dropout=dropout,
                             attention=attention, recompute=recompute, cp=cp)
    whole_on_each = not sp and tp > 1  # tensor parallelism without sequence parallelism
    whole = sum(n for term, n in terms.items() if term in WHOLE_WITHOUT_SP) if whole_on_each else 0
    per_layer = sum(terms.values()) - whole
    tokens = micro_batch * shape.seq // cp
    # after the layers: the final norm's input and statistics and the head's input (whole on each rank
    # without sp), the loss's float32 log-softmax (split by vocabulary) and its 0-dim total weight
    norm_tail = 2 * e * tokens * shape.hidden + (1 if shape.rms_norm else 2) * 4 * tokens
    tail, tail_whole = (4 * tokens * shape.vocab + 4, norm_tail) if whole_on_each else \
        (norm_tail + 4 * tokens * shape.vocab + 4, 0)
    in_flight = min(microbatches or pp, pp) if pp > 1 else 1
    layers = math.ceil(shape.layers / pp) * in_flight
    activations = math.ceil((per_layer * layers + (tail if pp == 1 else 0)) / tp) + \
        whole * layers + (tail_whole if pp == 1 else 0)
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
    parser.add_argument("--no-sp", dest="sp", action="store_false", help="tensor parallelism without sequence parallelism")
    parser.add_argument("--recompute", choices=RECOMPUTE, default="none",
                        help="selective: Korthikanti's (the attention core); keep-matmuls: this course's policy")
    parser.add_argument("--precision", choices=sorted(PRECISIONS), default="bf16-mixed")
    parser.add_argument("--attention", choices=("flash", "math"), default="flash")
    args = parser.parse_args(argv)
    shape = PRESETS[args.model] if not args.seq else replace(PRESETS[args.model], seq=args.seq)
    layer, outside = num_params(shape)
    got = bytes_per_rank(shape, micro_batch=args.micro_batch, dp=args.dp, tp=args.tp, pp=args.pp, cp=args.cp,
                         zero=args.zero, recompute=args.recompute, precision=args.precision,
                         attention=args.attention, sp=args.sp)
    print(f"{args.model}: {(layer * shape.layers + outside) / 1e9:.2f}e9 parameters, seq {shape.seq}, "
          f"micro-batch {args.micro_batch}, dp {args.dp} tp {args.tp}{'' if args.sp or args.tp == 1 else ' (no sp)'} "
          f"pp {args.pp} cp {args.cp}, "
          f"ZeRO-{args.zero}, recompute {args.recompute}, {args.precision}")
    for term, nbytes in got.items():
        print(f"  {term:<17} {gib(nbytes):>9} GiB")


if __name__ == "__main__":
    main()
