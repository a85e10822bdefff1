"""The step-time model on this machine: a CPU and gloo as ``stepmodel`` sees a GPU (issue 39, "How fast, and why").

``stepmodel`` turns FLOPs and bytes into seconds with a ``Hardware``'s figures. Here those figures are
measured, in the same run as the steps they predict (``python -m ddp_tutorial.bench stepmodel``):

- the achievable matmul rate (``roofline.peak_matmul_rate``) is both ``peak_flops`` and ``achievable_flops``;
- ``copy_bandwidth`` is the memory roof (``hbm_bytes_per_s``);
- gloo's all-reduce fitted as ``time = alpha + bytes / algbw`` (lesson 06's ``fit_alpha_beta``) becomes the
  model's per-ring-step latency and link bandwidth (``link_from_fit``): the same line, in the model's terms.

The measured model is a ``DeepMLP`` stack (``models.small``), so its FLOPs and bytes are counted here per
linear layer (``linear_flops``, ``layout_plan``) for DDP, FSDP2, Megatron TP and a 2-stage GPipe pipeline;
``predict_plan`` applies ``stepmodel``'s rules: DP/FSDP traffic hidden behind compute up to its length, TP
and pipeline sends exposed, a bubble of ``(p - 1) / m`` of a stage's busy time.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ddp_tutorial.performance.flops import TransformerShape
from ddp_tutorial.performance.hardware import Hardware
from ddp_tutorial.performance.stepmodel import StepLayout, collective_seconds, ring_bytes, ring_steps

__all__ = ["cpu_hardware", "link_from_fit", "linear_flops", "Plan", "layout_plan", "predict_plan", "LAYOUTS",
           "PredictedStep", "capstone_step"]

LAYOUTS = ("DDP", "FSDP2", "TP", "PP")
MEASURED = "measured on this machine in this run (python -m ddp_tutorial.bench stepmodel)"


def link_from_fit(alpha: float, algbw: float, n: int) -> tuple[float, float]:
    """An all-reduce fitted as ``alpha + bytes / algbw`` on ``n`` ranks, as (latency per ring step, link
    bytes/s): ``stepmodel.collective_seconds("all_reduce", ...)`` with them gives the fitted line back."""
    return alpha / ring_steps("all_reduce", n), algbw * ring_bytes("all_reduce", 1.0, n)


def cpu_hardware(*, matmul_flops: float, copy_bytes_per_s: float, latency_s: float, link_bytes_per_s: float,
                 name: str = "this CPU, gloo") -> Hardware:
    """This machine as a ``Hardware``: one measured rate is both peak and achievable (no data sheet here), and
    every group, inside a "node" or not, goes over the same link (loopback TCP)."""
    sources = {key: MEASURED for key in ("peak_flops", "achievable_flops", "hbm_bytes_per_s", "nvlink_bytes_per_s",
                                         "network_bytes_per_s", "latency_s")}
    return Hardware(name, matmul_flops, matmul_flops, copy_bytes_per_s, link_bytes_per_s, link_bytes_per_s,
                    latency_s, sources=sources)


def linear_flops(d_in: int, d_out: int, rows: int, *, input_grad: bool = True) -> int:
    """Forward and backward of ``nn.Linear(d_in, d_out)`` on ``rows`` rows: ``2 r i o`` forward, as much for the
    weight's gradient, and as much again for the input's unless the input needs none (a model's first layer)."""
    return 2 * rows * d_in * d_out * (3 if input_grad else 2)


@dataclass
class Plan:
    """One layout's step on one rank (the busiest): its FLOPs and the collectives it runs, each
    ``(kind, bytes, ranks, hidden)``; ``hidden`` traffic overlaps compute (DP, FSDP), the rest is exposed."""

    flops: int
    comms: list[tuple[str, float, int, bool]] = field(default_factory=list)
    stages: int = 1
    micro_batches: int = 1


def layout_plan(layout: str, sizes: list[tuple[int, int]], batch: int, *, ranks: int = 2, micro_batches: int = 4,
                value_bytes: int = 4) -> Plan:
    """FLOPs and traffic of one step of an MLP of linears ``sizes`` on a global ``batch`` of rows.

    DDP: the batch split, every gradient all-reduced. FSDP2 (ZeRO-3): the same compute, each weight
    all-gathered forward and again backward, gradients reduce-scattered. TP: layers 1-2 and 3-4 as
    column/row pairs on the whole batch, one all-reduce of each pair's output forward and of its input's
    gradient backward. PP: the layers cut in two halves, ``micro_batches`` sends forward and back."""
    params = sum(i * o + o for i, o in sizes) * value_bytes
    if layout in ("DDP", "FSDP2"):
        rows = batch // ranks
        flops = sum(linear_flops(i, o, rows, input_grad=k > 0) for k, (i, o) in enumerate(sizes))
        if layout == "DDP":
            return Plan(flops, [("all_reduce", params, ranks, True)])
        return Plan(flops, [("all_gather", params, ranks, True), ("all_gather", params, ranks, True),
                            ("reduce_scatter", params, ranks, True)])
    if layout == "TP":
        flops, comms = 0, []
        for k, (i, o) in enumerate(sizes):
            sharded = 1 <= k <= 4
            flops += linear_flops(i, o, batch, input_grad=k > 0) // (ranks if sharded else 1)
            if k in (2, 4):  # a row-parallel layer ends a pair: its output summed, its pair's input grad summed
                comms += [("all_reduce", batch * o * value_bytes, ranks, False),
                          ("all_reduce", batch * sizes[k - 1][0] * value_bytes, ranks, False)]
        return Plan(flops, comms)
    if layout == "PP":
        cut = len(sizes) // 2
        stages = [sizes[:cut], sizes[cut:]]
        flops = max(sum(linear_flops(i, o, batch, input_grad=(s, k) != (0, 0)) for k, (i, o) in enumerate(stage))
                    for s, stage in enumerate(stages))
        sent = batch // micro_batches * sizes[cut][0] * value_bytes
        return Plan(flops, [("send", sent, 2, False)] * (2 * micro_batches), stages=2, micro_batches=micro_batches)
    raise ValueError(f"no layout {layout!r}; choose one of {', '.join(LAYOUTS)}")


@dataclass(frozen=True)
class PredictedStep:
    """Seconds: compute, all communication, the part the step waits for, the pipeline bubble, the step."""

    compute_s: float
    comm_s: float
    exposed_s: float
    bubble_s: float
    step_s: float


def predict_plan(plan: Plan, hw: Hardware) -> PredictedStep:
    """``stepmodel.predict``'s rules on a ``Plan``: compute at the achievable rate, each collective at
    ``collective_seconds``, hidden traffic exposed only past the compute, the bubble ``(p-1)/m`` of a stage."""
    compute = plan.flops / hw.achievable_flops
    cost = [(collective_seconds(kind, nbytes, n, hw.network_bytes_per_s, hw.latency_s), hidden)
            for kind, nbytes, n, hidden in plan.comms]
    hidden = sum(s for s, h in cost if h)
    exposed = sum(s for s, h in cost if not h) + max(0.0, hidden - compute)
    bubble = compute * (plan.stages - 1) / plan.micro_batches
    return PredictedStep(compute, sum(s for s, _ in cost), exposed, bubble, compute + exposed + bubble)


def capstone_step(layout: dict, run: dict | None = None) -> tuple[TransformerShape, StepLayout]:
    """Lesson 22's composed step as ``stepmodel`` sees it: the ``CharGPT`` of ``GPTRun(**run)`` and the layout
    ``{"dp": ..., "tp": ..., "pp": ..., "cp": ...}`` with what the capstone applies to it: FSDP2 (ZeRO-3) over
    ``dp x cp`` where that is above 1, sequence parallelism with TP, ``microbatches`` per replica when pipelined,
    and the run's dtype for every value sent (float64 in the compared runs)."""
    from ddp_tutorial.capstone.chars import VOCAB
    from ddp_tutorial.capstone.reference import GPTRun

    gpt = GPTRun(**(run or {}))
    dp, tp, pp, cp = (layout.get(name, 1) for name in ("dp", "tp", "pp", "cp"))
    m = gpt.microbatches if pp > 1 else 1
    value_bytes = gpt.dtype.itemsize
    shape = TransformerShape(vocab=VOCAB, dim=gpt.dim, layers=gpt.layers, heads=gpt.heads, seq=gpt.seq)
    step = StepLayout(dp=dp, tp=tp, pp=pp, cp=cp, zero=3 if dp * cp > 1 else 0, sequence_parallel=tp > 1,
                      micro_batches=m, micro_batch=gpt.global_batch // (dp * m), grad_bytes=value_bytes,
                      value_bytes=value_bytes)
    return shape, step
