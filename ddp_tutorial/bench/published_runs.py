"""``bench published``: the step-time model against published training runs (issue 39, "How fast, and why").

Each row is one run of ``performance.published.RUNS`` (Llama 3 405B, Table 4; Megatron-LM, Table 1):
its layout as printed, the TFLOPs per GPU and MFU it reported, and what ``stepmodel.predict`` gives
for it with the published hardware of ``performance.hardware`` (one set of figures for every run,
never fitted), the memory-bound kernels (``performance.kernels``) timed at HBM bandwidth; the column
"matmul rate only" is the ratio without them, as if they ran at the matmul rate. Megatron-LM's TFLOP/s count recomputation, so they are held against the predicted
hardware TFLOPs; Llama 3's against the model's. Nothing is measured: the command takes a second.

    python -m ddp_tutorial.bench published [--json PATH]
"""

from __future__ import annotations

import argparse

from ddp_tutorial.bench.common import Result
from ddp_tutorial.performance.published import RUNS, PublishedRun
from ddp_tutorial.performance.stepmodel import StepTime, predict

HELP = "the step-time model against published runs (Llama 3 405B, Megatron-LM): predicted / published TFLOPs"
WITHIN = 0.2  # a prediction within 20% of the published figure counts as a hit


def layout_text(run: PublishedRun) -> str:
    """``TP8 CP1 PP16 DP64``: the degrees as the papers print them."""
    lay = run.layout
    return f"TP{lay.tp} CP{lay.cp} PP{lay.pp} DP{lay.dp}"


def tflops(run: PublishedRun, step: StepTime) -> float:
    """The predicted TFLOPs per GPU in the unit ``run`` published (with recomputation for Megatron-LM)."""
    return step.hardware_tflops_per_gpu if run.counts_recompute else step.model_tflops_per_gpu


def row(run: PublishedRun) -> dict:
    """One table row: published figures, predicted ones, their ratio, and what the model leaves out on a miss."""
    tflops_kernels = tflops(run, predict(run.shape, run.layout, run.hardware, memory_bound=run.kernels))
    matmul_only = tflops(run, predict(run.shape, run.layout, run.hardware))
    ratio = round(tflops_kernels / run.tflops_per_gpu, 2)  # the hit or miss is decided on the ratio as printed
    return {"source": run.source, "model": run.model, "GPUs": run.gpus, "hardware": run.hardware.name,
            "layout": layout_text(run), "sequence": run.shape.seq,
            "published TFLOPs": run.tflops_per_gpu, "published MFU": run.mfu,
            "predicted TFLOPs": round(tflops_kernels, 1),
            "predicted MFU": round(tflops_kernels * 1e12 / run.hardware.peak_flops, 3),
            "predicted/published": ratio, "matmul rate only": round(matmul_only / run.tflops_per_gpu, 2),
            "left out": "" if abs(ratio - 1) <= WITHIN else run.left_out}


def run(args: argparse.Namespace) -> Result:
    rows = [row(r) for r in RUNS]
    hits = sum(1 for r in rows if abs(r["predicted/published"] - 1) <= WITHIN)
    before = sum(1 for r in rows if abs(r["matmul rate only"] - 1) <= WITHIN)
    used = {r.hardware.name: r.hardware for r in RUNS}.values()
    assumed = [f"{hw.name}: peak {hw.peak_flops / 1e12:g}, achievable {hw.achievable_flops / 1e12:g} TFLOP/s; "
               f"NVLink {hw.nvlink_bytes_per_s / 1e9:g}, network {hw.network_bytes_per_s / 1e9:g} GB/s per GPU "
               f"one way; alpha {hw.latency_s * 1e6:g} us (sources: performance.hardware)" for hw in used]
    return Result(
        name="published: the step-time model against published training runs (no fitting)",
        columns=["source", "model", "GPUs", "hardware", "layout", "sequence", "published TFLOPs", "published MFU",
                 "predicted TFLOPs", "predicted MFU", "predicted/published", "matmul rate only", "left out"],
        rows=rows,
        notes=["TFLOPs per GPU; MFU against the dense bf16 peak; Megatron-LM's figures count recomputation",
               *assumed,
               "memory-bound kernels (norms, softmax, activations, residual adds, dropout) at HBM bandwidth from "
               f"their bytes (performance.kernels); at the matmul rate instead: {before} of {len(rows)} within "
               f"{WITHIN:.0%}",
               f"{hits} of {len(rows)} published runs predicted within {WITHIN:.0%}"],
    )
