"""A step-time model: one training step of a layout, predicted from FLOPs, bytes and published hardware (issue 39).

Every term is a calculation the reader can redo with a pencil:

- **compute**: the step's FLOPs per GPU (``flops.training_flops``: ``6 N + 12 L s d`` per token, and
  one more forward when activations are recomputed) over the hardware's *achievable* matmul rate;
- **communication**: each process group's collectives with the textbook ring volumes (``ring_bytes``)
  at ``alpha + bytes / bandwidth`` per ring step, over NVLink when the group fits in one node of
  ``GPUS_PER_NODE`` and over the network when it does not (groups nest ``[TP, CP, PP, DP]``, the
  innermost on neighbouring GPUs, as in Llama 3, section 3.3.2);
- **overlap**: DP/ZeRO traffic runs behind the backward (hidden up to the compute time), ring
  attention's K/V passes behind attention's compute; TP, EP, PP sends and the bubble are exposed;
- **bubble**: ``(p - 1) / (v m)`` of the time a stage computes (``orders.bubble_fraction`` as a share
  of the whole step).

    >>> from ddp_tutorial.performance.hardware import H100
    >>> shape = TransformerShape(vocab=128256, dim=4096, layers=32, heads=32, seq=8192, kv_heads=8,
    ...                          ffn_hidden=14336, gated=True)
    >>> step = predict(shape, StepLayout(dp=8, micro_batches=2), H100)
    >>> round(step.compute_s / step.step_s, 2) > 0.9  # one node of data parallelism: compute-bound
    True
"""

from __future__ import annotations

from dataclasses import dataclass

from ddp_tutorial.performance.flops import TransformerShape, training_flops
from ddp_tutorial.performance.hardware import GPUS_PER_NODE, Hardware

__all__ = ["StepLayout", "StepTime", "ring_bytes", "ring_steps", "collective_seconds", "group_link", "predict"]

ORDER = ("tp", "cp", "pp", "dp")  # innermost first: TP on neighbouring GPUs, DP across the cluster


@dataclass(frozen=True)
class StepLayout:
    """How a step is split: degrees of each parallelism, ``zero`` stage 0-3 over DP, ``micro_batches``
    ``m`` of ``micro_batch`` sequences per pipeline per step, ``virtual`` stages per rank (interleaved 1F1B),
    ``grad_bytes`` per gradient value on the wire (2 for bf16, 4 when reduced in fp32)."""

    dp: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    zero: int = 0
    sequence_parallel: bool = False
    micro_batches: int = 1
    micro_batch: int = 1
    virtual: int = 1
    recompute: bool = False
    grad_bytes: int = 2
    top_k: int = 1

    def __post_init__(self) -> None:
        for name in ("dp", "tp", "pp", "cp", "ep", "micro_batches", "micro_batch", "virtual", "grad_bytes", "top_k"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.zero not in (0, 1, 2, 3):
            raise ValueError(f"zero must be a stage 0-3, got {self.zero}")

    @property
    def gpus(self) -> int:
        return self.dp * self.tp * self.pp * self.cp


@dataclass(frozen=True)
class StepTime:
    """A predicted step: seconds of each term (``comm`` total per group, ``exposed`` what the step waits for)."""

    compute_s: float
    comm: dict[str, float]
    exposed: dict[str, float]
    bubble_s: float
    step_s: float
    tokens: int
    model_flops: float
    hardware_flops: float
    gpus: int
    peak_flops: float

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.step_s

    @property
    def model_tflops_per_gpu(self) -> float:
        return self.model_flops / self.gpus / self.step_s / 1e12

    @property
    def hardware_tflops_per_gpu(self) -> float:
        """What a counter that includes recomputation reports (Megatron-LM's published TFLOP/s do)."""
        return self.hardware_flops / self.gpus / self.step_s / 1e12

    @property
    def mfu(self) -> float:
        return self.model_tflops_per_gpu * 1e12 / self.peak_flops


def ring_bytes(kind: str, nbytes: float, n: int) -> float:
    """Bytes one rank sends in a bandwidth-optimal ring over ``n`` ranks, for an input of ``nbytes``
    (each rank's full tensor; for an all-gather, the gathered result): an all-reduce ``2 (n-1)/n``, a
    reduce-scatter or an all-gather ``(n-1)/n``, an all-to-all ``(n-1)/n`` (all but its own share)."""
    factor = {"all_reduce": 2 * (n - 1) / n, "reduce_scatter": (n - 1) / n, "all_gather": (n - 1) / n,
              "all_to_all": (n - 1) / n, "send": 1.0}
    if kind not in factor:
        raise ValueError(f"no collective {kind!r}; choose one of {', '.join(factor)}")
    return factor[kind] * nbytes


def ring_steps(kind: str, n: int) -> int:
    """Ring steps, each paying the latency ``alpha`` once: ``2 (n-1)`` for an all-reduce, ``n-1`` otherwise."""
    return 1 if kind == "send" else (2 if kind == "all_reduce" else 1) * (n - 1)


def group_link(layout: StepLayout, group: str, hardware: Hardware) -> float:
    """Bandwidth of ``group``'s ring: NVLink when its members share one node, else the network.

    Groups nest in ``ORDER``: a group's members are ``stride`` GPUs apart, ``stride`` the product
    of the degrees inside it, so it spans ``stride * size`` consecutive GPUs."""
    stride = 1
    for name in ORDER[:ORDER.index(group)]:
        stride *= getattr(layout, name)
    inside = stride * getattr(layout, group) <= GPUS_PER_NODE
    return hardware.nvlink_bytes_per_s if inside else hardware.network_bytes_per_s


def collective_seconds(kind: str, nbytes: float, n: int, bandwidth: float, latency: float) -> float:
    """The alpha-beta cost: ``steps * alpha + ring_bytes / bandwidth`` (nothing to do alone)."""
    if n == 1 and kind != "send":
        return 0.0
    return ring_steps(kind, n) * latency + ring_bytes(kind, nbytes, n) / bandwidth


def predict(shape: TransformerShape, layout: StepLayout, hardware: Hardware, *, moe_layers: int = 0) -> StepTime:
    """The step time of ``layout`` training ``shape`` on ``hardware`` (bf16 weights and activations)."""
    lay, hw = layout, hardware
    sequences = lay.dp * lay.micro_batches * lay.micro_batch
    tokens = sequences * shape.seq
    flops = training_flops(shape, tokens, recompute=lay.recompute)
    compute = flops.hardware / lay.gpus / hw.achievable_flops
    comm = {"tp": tp_seconds(shape, lay, hw), "cp": cp_seconds(shape, lay, hw), "pp": pp_seconds(shape, lay, hw),
            "dp": dp_seconds(shape, lay, hw), "ep": ep_seconds(shape, lay, hw, moe_layers)}
    # ring attention passes K/V while the previous block's attention computes: hidden up to that compute
    attention = flops.attention / lay.gpus / hw.achievable_flops
    exposed = {"tp": comm["tp"], "ep": comm["ep"], "pp": comm["pp"], "cp": max(0.0, comm["cp"] - attention),
               "dp": max(0.0, comm["dp"] - compute)}  # DP/ZeRO traffic behind the backward and forward
    busy = compute + exposed["tp"] + exposed["ep"] + exposed["cp"]  # what a stage does per step, microbatch by microbatch
    bubble = busy * (lay.pp - 1) / (lay.virtual * lay.micro_batches)
    step = busy + exposed["pp"] + exposed["dp"] + bubble
    return StepTime(compute, comm, exposed, bubble, step, tokens, flops.model, flops.hardware, lay.gpus,
                    hw.peak_flops)


def activation_bytes(shape: TransformerShape, layout: StepLayout) -> float:
    """One microbatch's activation tensor at a layer boundary: ``b x s/cp x h`` bf16 values."""
    return layout.micro_batch * shape.seq / layout.cp * shape.dim * 2


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
    """Ring attention: forward, each layer passes its K and V shards ``cp - 1`` steps round the ring; the
    backward passes K, V and their gradients (twice the forward's bytes). K/V are ``s/cp x kv_dim``
    each, ``kv_dim = dim * kv_heads / heads`` (grouped-query attention sends less), split over TP by heads."""
    c = layout.cp
    if c == 1:
        return 0.0
    kv_dim = shape.dim * (shape.kv_heads or shape.heads) // shape.heads
    shard = 2 * layout.micro_batch * shape.seq / c * kv_dim * 2 / layout.tp  # K and V, bf16, this rank's heads
    passes = (2 if layout.recompute else 1) + 2  # forward (again when recomputed) + backward
    link = group_link(layout, "cp", hw)
    per_layer = passes * (c - 1) * (hw.latency_s + shard / link)
    return per_layer * shape.layers / layout.pp * layout.micro_batches


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
    grads, weights = params * layout.grad_bytes, params * 2
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

