"""Each process group's communication seconds in one training step (issue 39; ``stepmodel.predict`` adds them).

One function per group, each the count of its collectives times their alpha-beta cost
(``steplayout.collective_seconds``): TP's all-reduces, CP's ring passes or Ulysses' all-to-alls, PP's
sends, DP/ZeRO's gradient and weight collectives, EP's token all-to-alls.
"""

from __future__ import annotations

from ddp_tutorial.performance.flops import TransformerShape
from ddp_tutorial.performance.hardware import GPUS_PER_NODE, Hardware
from ddp_tutorial.performance.steplayout import StepLayout, collective_seconds, group_link

__all__ = ["activation_bytes", "tp_seconds", "cp_seconds", "ring_cp_seconds", "ulysses_cp_seconds",
           "ulysses_tensor_bytes", "pp_seconds", "dp_seconds", "ep_seconds"]


def activation_bytes(shape: TransformerShape, layout: StepLayout) -> float:
    """One microbatch's activation tensor at a layer boundary: ``b x s/cp x h`` values (bf16: 2 bytes each)."""
    return layout.micro_batch * shape.seq / layout.cp * shape.dim * layout.value_bytes


def tp_seconds(shape: TransformerShape, layout: StepLayout, hw: Hardware) -> float:
    """Megatron TP: two all-reduces of the activations per layer forward (after attention and after the
    MLP), two backward, two more when the forward is recomputed. Sequence parallelism swaps each for a
    reduce-scatter and an all-gather: the same bytes and ring steps (Korthikanti et al. 2022)."""
    t = layout.tp
    per_layer = 6 if layout.recompute else 4
    count = per_layer * shape.layers / layout.pp * layout.micro_batches
    link, nbytes = group_link(layout, "tp", hw), activation_bytes(shape, layout)
    if layout.sequence_parallel:
        one = (collective_seconds("reduce_scatter", nbytes, t, link, hw.latency_s)
               + collective_seconds("all_gather", nbytes, t, link, hw.latency_s))
    else:
        one = collective_seconds("all_reduce", nbytes, t, link, hw.latency_s)
    return count * one


def cp_seconds(shape: TransformerShape, layout: StepLayout, hw: Hardware) -> float:
    """Context parallelism's seconds per step: ``ring_cp_seconds`` or ``ulysses_cp_seconds`` by ``cp_kind``."""
    if layout.cp == 1:
        return 0.0
    term = ulysses_cp_seconds if layout.cp_kind == "ulysses" else ring_cp_seconds
    return term(shape, layout, hw)


def ring_cp_seconds(shape: TransformerShape, layout: StepLayout, hw: Hardware) -> float:
    """Ring attention: forward, each layer passes its K and V shards ``cp - 1`` steps round the ring; the
    backward passes K, V and their gradients (twice the forward's bytes). K/V are ``s/cp x kv_dim``
    each, ``kv_dim = dim * kv_heads / heads`` (grouped-query attention sends less), split over TP by heads."""
    c = layout.cp
    kv_dim = shape.dim * (shape.kv_heads or shape.heads) // shape.heads
    shard = 2 * layout.micro_batch * shape.seq / c * kv_dim * layout.value_bytes / layout.tp  # K and V, this rank's heads
    passes = (2 if layout.recompute else 1) + 2  # forward (again when recomputed) + backward
    link = group_link(layout, "cp", hw)
    per_layer = passes * (c - 1) * (hw.latency_s + shard / link)
    return per_layer * shape.layers / layout.pp * layout.micro_batches


def ulysses_tensor_bytes(shape: TransformerShape, layout: StepLayout) -> dict[str, float]:
    """Each all-to-all's input on one rank, one layer's forward: q and the output ``b x s/cp x dim/t``,
    k and v ``b x s/cp x kv_dim/t``, bf16. With ``kv_heads / t < cp`` the K/V heads are replicated up to one
    per rank (DeepSpeed's GQA rule); ``heads`` must split over ``t x cp`` ranks."""
    t, c = layout.tp, layout.cp
    if shape.heads % (t * c):
        raise ValueError(f"Ulysses needs heads divisible by tp x cp: {shape.heads} heads over {t} x {c}")
    head_dim, local = shape.dim // shape.heads, layout.micro_batch * shape.seq / c * layout.value_bytes
    kv_heads = max((shape.kv_heads or shape.heads) / t, c)
    return {"q": local * shape.heads / t * head_dim, "k": local * kv_heads * head_dim,
            "v": local * kv_heads * head_dim, "out": local * shape.heads / t * head_dim}


def ulysses_cp_seconds(shape: TransformerShape, layout: StepLayout, hw: Hardware) -> float:
    """DeepSpeed-Ulysses (Jacobs et al. 2023; ``context_parallel.ulysses``): per layer forward, four
    all-to-alls, q, k, v to whole sequences of ``1/cp`` of the heads and the output back, each sending
    ``(cp-1)/cp`` of its input; the backward the same four on the gradients, the forward's again when
    recomputed. They block attention: nothing hides them."""
    c, link = layout.cp, group_link(layout, "cp", hw)
    one_pass = sum(collective_seconds("all_to_all", nbytes, c, link, hw.latency_s)
                   for nbytes in ulysses_tensor_bytes(shape, layout).values())
    passes = (2 if layout.recompute else 1) + 1
    return passes * one_pass * shape.layers / layout.pp * layout.micro_batches


def pp_seconds(shape: TransformerShape, layout: StepLayout, hw: Hardware) -> float:
    """Point-to-point: each microbatch sends its activations forward and their gradient back at every stage
    boundary a rank owns (``v`` of them with interleaving); with TP each rank sends its ``1/t`` share
    (Megatron's scatter-gather)."""
    if layout.pp == 1:
        return 0.0
    nbytes = activation_bytes(shape, layout) / layout.tp
    one = collective_seconds("send", nbytes, 2, group_link(layout, "pp", hw), hw.latency_s)
    return 2 * layout.virtual * layout.micro_batches * one


def dp_seconds(shape: TransformerShape, layout: StepLayout, hw: Hardware) -> float:
    """Gradients of this rank's weights (``1/(t p)`` of them) over the ``dp x cp`` ranks that hold the same
    weights: ZeRO 0 all-reduces them; ZeRO 1 and 2 reduce-scatter the gradients and all-gather the
    updated weights (the same bytes); ZeRO 3 all-gathers the weights once more, for the backward: 1.5x."""
    n = layout.dp * layout.cp
    params = (shape.matmul_params + shape.embedding_params) / (layout.tp * layout.pp)
    link, lat = group_link(layout, "dp", hw), hw.latency_s
    grads, weights = params * layout.grad_bytes, params * layout.value_bytes
    if layout.zero == 0:
        return collective_seconds("all_reduce", grads, n, link, lat)
    gathers = 2 if layout.zero == 3 else 1
    return (collective_seconds("reduce_scatter", grads, n, link, lat)
            + gathers * collective_seconds("all_gather", weights, n, link, lat))


def ep_seconds(shape: TransformerShape, layout: StepLayout, hw: Hardware, moe_layers: int) -> float:
    """Expert parallelism: each MoE layer sends its tokens to their experts and back (two all-to-alls)
    forward and two backward, ``top_k`` copies of each token. EP groups are taken inside the DP group."""
    if layout.ep == 1 or moe_layers == 0:
        return 0.0
    nbytes = activation_bytes(shape, layout) * layout.top_k
    link = hw.nvlink_bytes_per_s if layout.ep * layout.tp * layout.cp * layout.pp <= GPUS_PER_NODE \
        else hw.network_bytes_per_s
    one = collective_seconds("all_to_all", nbytes, layout.ep, link, hw.latency_s)
    return 4 * one * moe_layers / layout.pp * layout.micro_batches

