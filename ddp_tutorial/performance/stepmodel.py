"""A step-time model: one training step of a layout, predicted from FLOPs, bytes and published hardware (issue 39).

Every term is a calculation the reader can redo with a pencil:

- **compute**: the step's FLOPs per GPU (``flops.training_flops``: ``6 N + 12 L s d`` per token, and
  one more forward when activations are recomputed) over the hardware's *achievable* matmul rate;
- **communication**: each process group's collectives with the textbook ring volumes (``ring_bytes``)
  at ``alpha + bytes / bandwidth`` per ring step, over NVLink when the group fits in one node of
  ``GPUS_PER_NODE`` and over the network when it does not (groups nest ``[TP, CP, PP, DP]``, the
  innermost on neighbouring GPUs, as in Llama 3, section 3.3.2);
- **overlap**: DP/ZeRO traffic runs behind the backward (hidden up to the compute time), ring
  attention's K/V passes behind attention's compute; TP, EP, PP sends, Ulysses' all-to-alls (context
  parallelism's other kind, ``StepLayout.cp_kind``) and the bubble are exposed;
- **memory-bound kernels** (optional, ``predict(..., memory_bound=Kernels(...))``): norms, softmax,
  activations, residual adds and dropout at HBM bandwidth from the bytes they move (``kernels``);
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
from ddp_tutorial.performance.hardware import Hardware
from ddp_tutorial.performance.kernels import Kernels, memory_bound_seconds
from ddp_tutorial.performance.stepcomm import (
    activation_bytes,
    cp_seconds,
    dp_seconds,
    ep_seconds,
    pp_seconds,
    tp_seconds,
)
from ddp_tutorial.performance.steplayout import StepLayout, collective_seconds, group_link, ring_bytes, ring_steps

__all__ = ["StepLayout", "StepTime", "ring_bytes", "ring_steps", "collective_seconds", "group_link", "predict",
           "activation_bytes", "tp_seconds", "cp_seconds", "pp_seconds", "dp_seconds", "ep_seconds"]


@dataclass(frozen=True)
class StepTime:
    """A predicted step: seconds of each term (``comm`` total per group, ``exposed`` what the step waits for;
    ``memory_s`` the memory-bound kernels, 0 unless ``predict`` was given ``memory_bound``)."""

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
    memory_s: float = 0.0

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


def predict(shape: TransformerShape, layout: StepLayout, hardware: Hardware, *, moe_layers: int = 0,
            memory_bound: Kernels | None = None) -> StepTime:
    """The step time of ``layout`` training ``shape`` on ``hardware`` (bf16 weights and activations).

    ``memory_bound``: the run's non-matmul kernels (``kernels.Kernels``), timed at HBM bandwidth and added
    to the compute (``StepTime.memory_s``); ``None`` leaves them out, as if they ran at the matmul rate."""
    lay, hw = layout, hardware
    sequences = lay.dp * lay.micro_batches * lay.micro_batch
    tokens = sequences * shape.seq
    flops = training_flops(shape, tokens, recompute=lay.recompute)
    memory = 0.0 if memory_bound is None else memory_bound_seconds(shape, lay, hw, memory_bound)
    compute = flops.hardware / lay.gpus / hw.achievable_flops
    comm = {"tp": tp_seconds(shape, lay, hw), "cp": cp_seconds(shape, lay, hw), "pp": pp_seconds(shape, lay, hw),
            "dp": dp_seconds(shape, lay, hw), "ep": ep_seconds(shape, lay, hw, moe_layers)}
    # ring attention passes K/V while the previous block's attention computes: hidden up to that compute;
    # Ulysses' all-to-alls come before and after attention: exposed
    attention = 0.0 if lay.cp_kind == "ulysses" else flops.attention / lay.gpus / hw.achievable_flops
    exposed = {"tp": comm["tp"], "ep": comm["ep"], "pp": comm["pp"], "cp": max(0.0, comm["cp"] - attention),
               "dp": max(0.0, comm["dp"] - compute - memory)}  # DP/ZeRO traffic behind the backward and forward
    busy = compute + memory + exposed["tp"] + exposed["ep"] + exposed["cp"]  # a stage's work, microbatch by microbatch
    bubble = busy * (lay.pp - 1) / (lay.virtual * lay.micro_batches)
    step = busy + exposed["pp"] + exposed["dp"] + bubble
    return StepTime(compute, comm, exposed, bubble, step, tokens, flops.model, flops.hardware, lay.gpus,
                    hw.peak_flops, memory)

