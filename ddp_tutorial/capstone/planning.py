"""Choosing a layout for a real model and cluster with the memory calculator (``22_capstone``).

Rules that every candidate obeys, after the Ultra-Scale Playbook's reasoning (tp inside a node,
pp for what one node cannot hold) with one rule of this course's own (stages of whole nodes):

- tensor parallelism within a node: ``tp <= gpus_per_node`` (its collectives sit on the critical
  path of every layer and need NVLink's bandwidth), and ``tp`` divides the attention heads and
  the key/value heads;
- pipeline parallelism across nodes: each stage holds whole nodes (``gpus / pp`` a multiple of
  ``gpus_per_node``), so that no node holds two stages. It does not keep FSDP inside a node: a
  stage of ``gpus / pp`` GPUs spans several nodes whenever ``dp·cp·tp > gpus_per_node`` (64 GPUs,
  ``pp = 2``: 4 nodes a stage), and FSDP's all-gathers and reduce-scatters then cross nodes too;
- data parallelism (ZeRO-1 or FSDP/ZeRO-3) with whatever ranks are left, on the mesh
  ``pp, dp, cp, tp`` (``layout.MESH_DIMS``). Which dimension is outermost is a convention, and the
  two in use disagree: torchtitan (``["pp", "dp_replicate", "dp_shard", "cp", "tp"]``) and
  Megatron-Core (``order="tp-cp-ep-dp-pp"``, innermost first) put ``pp`` outermost, since its
  point-to-point activations tolerate the slowest links; Llama 3 (paper §3.3.2, ``[TP, CP, PP, DP]``
  innermost to outermost) and picotron (``view(dp, pp, cp, tp)``) put ``dp`` outermost, since
  FSDP's prefetched all-gathers tolerate latency. The course follows torchtitan, whose pieces it uses;
- context parallelism for long sequences: it splits the tokens, so it divides the activations,
  and its ranks join FSDP's group (ZeRO shards over ``dp × cp``), so it divides the model state as
  ``dp`` ranks do.

``layout_table`` prices every candidate with ``calculator.bytes_per_rank``; ``fitting_layouts``
keeps those that fit, cheapest first in that order: fewest pipeline stages (a bubble each),
least recomputation (compute spent again), fewest context ranks, fewest tensor ranks (both
communicate inside each layer), the least sharding. Bytes only: temporary buffers and
fragmentation are not counted, hence the ``headroom`` kept free; time is not modelled here:
``performance.timing_plan`` (lesson "How fast, and why") ranks the same layouts by predicted step time.

    python -m ddp_tutorial.capstone.rank_memory --plan llama3-8b --gpus 64
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ddp_tutorial.sharding.calculator import PRESETS, ModelShape, bytes_per_rank

__all__ = ["LLAMA3_405B", "PLAN_MODELS", "RECOMPUTE", "GIB", "PlannedLayout", "candidates", "layout_table", "fitting_layouts",
           "plan_report"]

# Llama 3 405B (Llama 3 paper, Table 3): 126 layers, 16,384 wide, FFN 53,248, 128 heads, 8 KV heads, 8K pre-training
LLAMA3_405B = ModelShape(layers=126, hidden=16384, heads=128, vocab=128256, seq=8192, ffn=53248, kv_heads=8,
                         gated=True, bias=False, rms_norm=True)
PLAN_MODELS = {"llama3-8b": PRESETS["llama-8b"], "llama3-70b": PRESETS["llama-70b"], "llama3-405b": LLAMA3_405B}
RECOMPUTE = ("none", "keep-matmuls", "full")  # in order of the compute they spend again
GIB = 2**30


@dataclass(frozen=True)
class PlannedLayout:
    """One candidate: its parallelism, ZeRO stage and recomputation, the busiest rank's bytes, and whether they fit."""

    dp: int
    tp: int
    pp: int
    cp: int
    zero: int
    recompute: str
    bytes: int
    fits: bool

    def cost(self) -> tuple:
        """The preference order of the module docstring: smaller is cheaper."""
        return (self.pp, RECOMPUTE.index(self.recompute), self.cp, self.tp, self.zero)

    def __str__(self) -> str:
        return (f"dp {self.dp:>3} tp {self.tp} pp {self.pp:>2} cp {self.cp:>2}  ZeRO-{self.zero}  "
                f"recompute {self.recompute:<9} {self.bytes / GIB:7.1f} GiB")


def _powers_of_two(limit: int) -> list[int]:
    return [2**i for i in range(limit.bit_length()) if 2**i <= limit]


def candidates(shape: ModelShape, *, gpus: int, gpus_per_node: int = 8,
               uneven_stages: bool = False) -> list[tuple[int, int, int, int]]:
    """Every ``(dp, tp, pp, cp)`` of ``gpus`` ranks that the rules admit (powers of two). ``uneven_stages``
    admits ``pp`` that does not divide the layers (stages of ``ceil(layers / pp)`` or fewer: Llama 3's 126
    layers on 16 stages, one layer fewer on the first and the last, paper section 3.3.2)."""
    heads = [shape.heads, shape.kv_heads or shape.heads]
    out = []
    for tp in _powers_of_two(gpus_per_node):  # within a node
        for pp in _powers_of_two(gpus // tp):
            stage = gpus // pp
            whole_layers = pp <= shape.layers if uneven_stages else shape.layers % pp == 0
            if any(n % tp for n in heads) or not whole_layers or (pp > 1 and stage % gpus_per_node):
                continue  # whole heads per rank, whole layers per stage, whole nodes per stage
            for cp in _powers_of_two(stage // tp):
                if gpus % (tp * pp * cp) == 0 and shape.seq % (cp * tp) == 0:
                    out.append((gpus // (tp * pp * cp), tp, pp, cp))
    return out


def layout_table(shape: ModelShape, *, gpus: int, gpu_bytes: int, gpus_per_node: int = 8, micro_batch: int = 1,
                 headroom: float = 0.1, uneven_stages: bool = False) -> list[PlannedLayout]:
    """Every admitted layout with ZeRO-1 or ZeRO-3 and each recomputation, priced (bf16 mixed precision,
    a fused attention kernel); ``fits`` when the busiest rank's total stays under ``(1 - headroom)·gpu_bytes``."""
    rows = []
    for dp, tp, pp, cp in candidates(shape, gpus=gpus, gpus_per_node=gpus_per_node, uneven_stages=uneven_stages):
        for zero in (1, 3):
            for recompute in RECOMPUTE:
                total = bytes_per_rank(shape, micro_batch=micro_batch, dp=dp, tp=tp, pp=pp, cp=cp, zero=zero,
                                       recompute=recompute)["total"]
                rows.append(PlannedLayout(dp, tp, pp, cp, zero, recompute, total,
                                          total <= (1 - headroom) * gpu_bytes))
    return rows


def fitting_layouts(shape: ModelShape, *, gpus: int, gpu_bytes: int, gpus_per_node: int = 8, seq: int | None = None,
                    micro_batch: int = 1, headroom: float = 0.1, uneven_stages: bool = False) -> list[PlannedLayout]:
    """The layouts of ``layout_table`` that fit, cheapest first (``PlannedLayout.cost``); ``seq`` overrides the shape's."""
    if seq is not None:
        shape = replace(shape, seq=seq)
    table = layout_table(shape, gpus=gpus, gpu_bytes=gpu_bytes, gpus_per_node=gpus_per_node,
                         micro_batch=micro_batch, headroom=headroom, uneven_stages=uneven_stages)
    return sorted((row for row in table if row.fits), key=PlannedLayout.cost)


def plan_report(name: str, *, gpus: int, gpu_gib: int = 80, gpus_per_node: int = 8, seq: int | None = None,
             top: int = 5) -> list[str]:
    """Lines that say which layouts of ``gpus`` GPUs fit model ``name`` (``PLAN_MODELS``), cheapest first."""
    shape = PLAN_MODELS[name]
    rows = fitting_layouts(shape, gpus=gpus, gpu_bytes=gpu_gib * GIB, gpus_per_node=gpus_per_node, seq=seq)
    head = (f"{name}, sequences of {seq or shape.seq}, on {gpus} GPUs of {gpu_gib} GiB "
            f"({gpus // gpus_per_node} node{'s' if gpus > gpus_per_node else ''} of {gpus_per_node}): "
            f"{len(rows)} layouts fit")
    return [head] + [f"  {row}" for row in rows[:top]]
