"""Published training runs with their layouts and reported throughput, each cited (issue 39).

Two sources, transcribed as printed:

- ``LLAMA3``: Grattafiori et al. 2024, "The Llama 3 Herd of Models", Table 4 (Llama 3 405B on H100s:
  GPUs, TP, CP, PP, DP, sequence length, batch size per DP, TFLOPs/GPU, BF16 MFU). Section 3.3.2 adds:
  FP32 gradient reduce-scatter, no activation checkpointing at 8K (at 131K it is not stated: none
  assumed), context parallelism by all-gathering K and V (modelled as a ring: the same bytes). Its TFLOPs
  are rounded to tens.
- ``MEGATRON``: Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters
  Using Megatron-LM", Table 1 (GPT models, vocabulary 51,200, sequence 2,048, A100s: heads, hidden,
  layers, TP, PP, GPUs, batch size, achieved TFLOP/s per GPU, percentage of the 312 TFLOP/s peak). Its
  FLOPs formula (eq. 3) counts activation recomputation, so its TFLOP/s are the hardware's, not the model's.

What neither table gives, assumed the same for every row: one sequence per microbatch, so ``m = batch per
DP``; no interleaving (``virtual = 1``). Megatron-LM's section 5.1 says its Table 1 runs use "the interleaved
pipeline schedule with the scatter/gather optimization enabled" but not how many stages per rank: ``v = 1``
is kept, the largest bubble ``(p - 1) / m`` (a ``v`` of 2 would only raise the predictions, already high).
Megatron's runs recompute activations and reduce bf16 gradients.

Memory-bound kernels (``kernels.Kernels``, what ``bench published`` times at HBM bandwidth): Megatron-LM's
GPT with dropout and its fused softmax over the materialised scores (section 4.2); Llama 3 with
flash attention and no dropout (neither stated in the paper: assumed, as in Meta's released code).
"""

from __future__ import annotations

from dataclasses import dataclass

from ddp_tutorial.performance.flops import TransformerShape
from ddp_tutorial.performance.hardware import A100, H100, Hardware
from ddp_tutorial.performance.kernels import Kernels
from ddp_tutorial.performance.stepmodel import StepLayout

__all__ = ["PublishedRun", "LLAMA3", "MEGATRON", "RUNS"]

LLAMA3 = "Llama 3 (Grattafiori et al. 2024), Table 4"
MEGATRON = "Megatron-LM (Narayanan et al. 2021), Table 1"
# what the model leaves out, the likeliest reason first (printed where a prediction misses by over 20%)
LLAMA3_LEFT_OUT = ("pipeline schedule's interleaving not given (v = 1 assumed); no straggler or failure time; "
                   "perfect DP overlap assumed")
MEGATRON_LEFT_OUT = ("matmuls assumed at the A100's best measured rate (MAMF, large square GEMMs); kernel launch gaps, "
                     "the loss and the optimizer step; DP all-reduce assumed hidden behind the backward")


@dataclass(frozen=True)
class PublishedRun:
    """One row of a published table: what ran (``shape``, ``layout``, ``hardware``) and what it reported.
    ``counts_recompute``: the reported TFLOPs include recomputed FLOPs (compare with the hardware's);
    ``tflops_step``: the unit the TFLOPs were rounded to (10 for Llama 3's 430, 400, 380); ``kernels``: the
    run's memory-bound kernels (``kernels.Kernels``)."""

    source: str
    model: str
    shape: TransformerShape
    layout: StepLayout
    hardware: Hardware
    tflops_per_gpu: float
    mfu: float
    counts_recompute: bool = False
    tflops_step: float = 1.0
    left_out: str = ""
    kernels: Kernels = Kernels()

    @property
    def gpus(self) -> int:
        return self.layout.gpus


def llama3_405b(seq: int) -> TransformerShape:
    """Llama 3 405B (Table 3 of the paper): 126 layers, dim 16,384, FFN 53,248, 128 heads, 8 KV heads, vocab 128K."""
    return TransformerShape(vocab=128256, dim=16384, layers=126, heads=128, kv_heads=8, ffn_hidden=53248,
                            gated=True, seq=seq)


def llama3_run(gpus: int, tp: int, cp: int, pp: int, dp: int, *, seq: int, batch_per_dp: int, tflops: float,
               mfu: float) -> PublishedRun:
    layout = StepLayout(dp=dp, tp=tp, cp=cp, pp=pp, zero=2, sequence_parallel=True, micro_batches=batch_per_dp,
                    grad_bytes=4)
    assert layout.gpus == gpus, f"Table 4 row: {tp} x {cp} x {pp} x {dp} != {gpus}"
    return PublishedRun(LLAMA3, "Llama 3 405B", llama3_405b(seq), layout, H100, tflops, mfu, tflops_step=10,
                        left_out=LLAMA3_LEFT_OUT, kernels=Kernels(dropout=False, flash_attention=True))


def megatron_run(params_b: float, heads: int, hidden: int, layers: int, tp: int, pp: int, gpus: int,
                 batch: int, tflops: float, percent: float) -> PublishedRun:
    dp = gpus // (tp * pp)
    assert dp * tp * pp == gpus and batch % dp == 0, f"Table 1 row {params_b}B does not divide"
    shape = TransformerShape(vocab=51200, dim=hidden, layers=layers, heads=heads, seq=2048)
    layout = StepLayout(dp=dp, tp=tp, pp=pp, micro_batches=batch // dp, recompute=True)
    return PublishedRun(MEGATRON, f"GPT {params_b}B", shape, layout, A100, tflops, percent / 100,
                        counts_recompute=True, left_out=MEGATRON_LEFT_OUT, kernels=Kernels(dropout=True))


RUNS = [
    # Llama 3, Table 4: GPUs, TP, CP, PP, DP, seq, batch size/DP, TFLOPs/GPU, BF16 MFU (16M tokens per batch)
    llama3_run(8192, 8, 1, 16, 64, seq=8192, batch_per_dp=32, tflops=430, mfu=0.43),
    llama3_run(16384, 8, 1, 16, 128, seq=8192, batch_per_dp=16, tflops=400, mfu=0.41),
    llama3_run(16384, 8, 16, 16, 8, seq=131072, batch_per_dp=16, tflops=380, mfu=0.38),
    # Megatron-LM, Table 1: params (B), heads, hidden, layers, TP, PP, GPUs, batch, TFLOP/s per GPU, % of peak
    megatron_run(1.7, 24, 2304, 24, 1, 1, 32, 512, 137, 44),
    megatron_run(3.6, 32, 3072, 30, 2, 1, 64, 512, 138, 44),
    megatron_run(7.5, 32, 4096, 36, 4, 1, 128, 512, 142, 46),
    megatron_run(18.4, 48, 6144, 40, 8, 1, 256, 1024, 135, 43),
    megatron_run(39.1, 64, 8192, 48, 8, 2, 512, 1536, 138, 44),
    megatron_run(76.1, 80, 10240, 60, 8, 4, 1024, 1792, 140, 45),
    megatron_run(145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148, 47),
    megatron_run(310.1, 128, 16384, 96, 8, 16, 1920, 2160, 155, 50),
    megatron_run(529.6, 128, 20480, 105, 8, 35, 2520, 2520, 163, 52),
    megatron_run(1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 163, 52),
]
