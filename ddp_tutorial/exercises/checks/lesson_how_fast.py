"""Lesson 23's exercises: a run's MFU from what it reports (23.1), and the seconds a step's gradient
all-reduce takes (23.2, its cases and worker in ``estimates``).

Both are pure arithmetic, checked in one process against the formulas written out here (not the
course's ``performance`` modules the learner may call). A wrong number is explained by the fewest
typical mistakes that give it (``estimates.fewest_mistakes``): each public way of getting MFU wrong
(embeddings in ``N``, the job's tokens over one GPU's peak, the sparsity peak, attention left out,
the forward alone, recomputation counted: HFU) scales a known term, and every case makes each
mistake visible with a number no other mistake gives.
"""

from __future__ import annotations

import math

from ddp_tutorial.exercises.checks.estimates import dp_comm_time_worker, fewest_mistakes, not_a_number, verdict
from ddp_tutorial.exercises.exercise import Exercise
from ddp_tutorial.exercises.harness import Case, Report, load_function, run_cases
from ddp_tutorial.exercises.tracing import traced
from ddp_tutorial.performance.flops import TransformerShape

# (label, shape, tokens per second of the whole job, GPUs, the sheet's bf16 FLOP/s, whether that is with sparsity)
MFU_CASES = [
    ("GPT-2 XL's shape (48 layers, dim 1600, vocab 50257, seq 1024) on 16 A100s, 218k tokens/s, sheet 312 "
     "TFLOPS dense", TransformerShape(vocab=50257, dim=1600, layers=48, heads=25, seq=1024), 218_000, 16, 312e12, False),
    ("Llama 3 8B's shape (32 layers, dim 4096, 8 KV heads, SwiGLU 14336, vocab 128256, seq 8192) on 64 H100s, "
     "440k tokens/s, sheet 1979 TFLOPS with sparsity",
     TransformerShape(vocab=128256, dim=4096, layers=32, heads=32, seq=8192, kv_heads=8, ffn_hidden=14336,
                      gated=True), 440_000, 64, 1979e12, True),
    ("a 1.3B GPT (24 layers, dim 2048, vocab 50304) at seq 131072 on 16 H200s, 70k tokens/s, sheet 989 TFLOPS "
     "dense (attention outweighs the weights)",
     TransformerShape(vocab=50304, dim=2048, layers=24, heads=16, seq=131072), 70_000, 16, 989e12, False),
]
REL = 2e-3  # norms and biases are left out of N; counting them moves MFU by less than this


def weights(shape: TransformerShape) -> int:
    """One block's multiplying weights: q, k, v, o and the MLP's matrices (GQA's k and v smaller)."""
    d, kv = shape.dim, shape.dim // shape.heads * (shape.kv_heads or shape.heads)
    mlp = (3 if shape.gated else 2) * d * (shape.ffn_hidden or 4 * d)
    return 2 * d * d + 2 * d * kv + mlp


def mfu_knobs(shape: TransformerShape, gpus: int, sheet: float, sparse: bool) -> dict:
    """Each term of MFU: the right choice first, then the typical mistakes."""
    dense = sheet / 2 if sparse else sheet
    return {
        "blocks": [(None, shape.layers * weights(shape)),
                   ("N counted as GPT's 12 L h^2: this shape's blocks differ (grouped-query K/V, a gated MLP of "
                    "its own width); count each block's matrices", 12 * shape.layers * shape.dim ** 2)],
        "head": [(None, shape.dim * shape.vocab),
                 ("the output head left out of N: it is a dim x vocab matmul like any linear", 0)],
        "embedding": [(None, 0), ("the embedding's vocab x dim parameters counted in N: a lookup does no "
                                  "multiply, only the output head counts", shape.dim * shape.vocab)],
        "passes": [(None, 3), ("the forward's FLOPs only (2 N per token): the backward does twice the forward, "
                               "6 N in all", 1),
                   ("the backward counted as one forward (4 N): it computes the gradients of the inputs and "
                    "of the weights, twice the forward", 2),
                   ("8 N: the recomputed forward counted; that is HFU (hardware FLOPs), MFU counts each FLOP "
                    "the model needs once", 4)],
        "attention": [(None, 12), ("attention's 12 L s h per token left out (Q K^T and P V have no "
                                   "parameters, so 6 N misses them)", 0),
                      ("attention counted as 6 L s h, the causal half; PaLM's MFU counts the whole s x s "
                       "square, 12 L s h", 6),
                      ("attention's forward only (4 L s h): with its backward it is 12 L s h", 4),
                      ("attention's 16 L s h: its recomputed forward counted (HFU); MFU counts 12 L s h", 16)],
        "gpus": [(None, gpus), ("the whole job's tokens/s over ONE GPU's peak: divide by the peak of all "
                                f"{gpus} GPUs", 1),
                 (f"divided by the {gpus} GPUs twice: tokens_per_s is already the whole job's", gpus ** 2)],
        "peak": [(None, dense), ("the sheet's sparsity figure used as the peak: 2:4 sparsity doubles it, a "
                                 "dense training run reaches at most half of it", sheet),
                 ("a dense sheet figure halved: only a figure with sparsity is twice the dense peak", sheet / 2)],
        "unit": [(None, 1.0), ("a percentage: return a fraction (0.4, not 40)", 100.0)],
    }


def mfu_of(shape: TransformerShape, tokens_per_s: float, k: dict) -> float:
    """MFU for one choice of every term."""
    n = k["blocks"] + k["head"] + k["embedding"]
    per_token = 2 * k["passes"] * n + k["attention"] * shape.layers * shape.seq * shape.dim
    return k["unit"] * tokens_per_s * per_token / (k["gpus"] * k["peak"])


def run_mfu_worker(rank: int, world_size: int, source: str, function: str, trace_dir: str) -> Report:
    """Each case of ``MFU_CASES``: the learner's MFU against the reference, else the mistakes that give it."""
    with traced(rank, trace_dir) as trace:
        fn = load_function(source, function)

        def case(shape: TransformerShape, tokens_per_s: float, gpus: int, sheet: float, sparse: bool) -> str | None:
            call = f"run_mfu(<the shape>, {tokens_per_s}, {gpus}, sheet_flops={sheet:.4g}, sparse={sparse})"
            got = fn(shape, tokens_per_s, gpus, sheet_flops=sheet, sparse=sparse)
            wrong = not_a_number(got)
            if wrong:
                return f"{call} {wrong}"
            n = shape.layers * weights(shape) + shape.dim * shape.vocab
            per_token = 6 * n + 12 * shape.layers * shape.seq * shape.dim
            want = tokens_per_s * per_token / (gpus * (sheet / 2 if sparse else sheet))
            if math.isclose(got, want, rel_tol=REL):
                return None
            mistakes = fewest_mistakes(got, mfu_knobs(shape, gpus, sheet, sparse), lambda k: mfu_of(shape, tokens_per_s, k),
                                       rel=REL / 2)
            above = " (above 1: more FLOPs than the GPUs can do)" if got > 1 else ""
            return verdict(call, got, want, mistakes,
                           f"{per_token:.6g} model FLOPs per token (6 N with N = {n:.6g}, plus 12 L s h), times the "
                           f"tokens per second, over {gpus} x the dense peak") + above

        cases: list[Case] = [(label, lambda a=args: case(*a)) for label, *args in MFU_CASES]
        return run_cases(trace, cases)


EXERCISES = [
    Exercise(
        name="run_mfu", number="23.1", lesson=23, notebook="23_how_fast.ipynb",
        title="a training run's MFU from what it reports", level="medium",
        task=("From a run's report (the model's shape, the whole job's tokens per second, the number of GPUs and "
              "the data sheet's bf16 figure), compute its model FLOPs utilisation: the FLOPs the model needs per "
              "second over the dense peak of all its GPUs."),
        hint=("Count the FLOPs one token costs in a training step: which parameters multiply, how many forwards' "
              "worth a forward and a backward are, and what attention adds that has no parameters. Then ask "
              "how many GPUs those tokens/s ran on, and which peak a dense run can reach."),
        more_hints=(
            "N is the weights that multiply: every block's linears and the output head (shape.matmul_params), "
            "not the embedding, a lookup. A forward costs 2 FLOPs per weight per token, the backward twice "
            "that. Attention's Q K^T and P V cost 4 s h per layer per token forward, over the whole s x s "
            "square. Nothing recomputed counts. An NVIDIA headline figure with sparsity is twice the dense peak.",
            "flops per token = 6 * shape.matmul_params + 12 * shape.layers * shape.seq * shape.dim; "
            "peak = sheet_flops / 2 if sparse else sheet_flops; mfu = tokens_per_s * flops per token / "
            "(gpus * peak).",
        ),
        checks=("three runs in one process: GPT-2 XL's shape on 16 A100s, Llama 3 8B's (grouped-query, SwiGLU) on "
                "64 H100s against a sparsity figure, a 1.3B GPT at seq 131072 on 16 H200s; within 0.2% of "
                "6 N + 12 L s h per token written out in the checker; a wrong number is explained by the typical "
                "mistakes that give it (embeddings in N, one GPU's peak, the sparsity peak, attention left out, "
                "forward only, recomputation counted, a percentage); the course's flops helpers may be used"),
        worker=run_mfu_worker, world_sizes=(1,), init_process_group=False),
    Exercise(
        name="dp_comm_time", number="23.2", lesson=23, notebook="23_how_fast.ipynb",
        title="a data-parallel step's gradient all-reduce time, alpha-beta", level="medium",
        task=("Predict the seconds a data-parallel step spends all-reducing its gradients: params values of a "
              "given dtype, a ring all-reduce per bucket over ranks ranks, a link's speed in Gb/s and a latency "
              "per message (lesson 06's alpha-beta model)."),
        hint=("Count what one rank sends in a ring all-reduce of one bucket, and how many messages that takes; "
              "each message pays the latency once and its bytes over the link. Then add up the buckets. Mind "
              "the units: the link is sold in gigabits."),
        more_hints=(
            "A ring all-reduce is a reduce-scatter then an all-gather: 2 (n - 1) steps, each sending one n-th "
            "of the bucket. Each bucket is its own all-reduce: its own 2 (n - 1) latencies. The bytes of all "
            "the buckets add up to the whole gradient: params x the dtype's size (bf16 and fp16: 2 bytes).",
            "seconds = buckets * 2 * (ranks - 1) * latency_s + 2 * (ranks - 1) / ranks * params * "
            "bytes_per_value / (link_gbps * 1e9 / 8); 0 on one rank.",
        ),
        checks=("four steps in one process: 8B bf16 gradients over 16 ranks on a 400 Gb/s network "
                "(bandwidth-bound), 10M fp32 over 64 ranks (latency-bound), 1.3B fp16 over 3 ranks on NVLink, "
                "one rank; against the alpha-beta ring written out in the checker; a wrong number is explained "
                "by the typical mistakes that give it (the all-reduce's factor 2, (n - 1) / n, the latency per "
                "bucket and per ring step, bits for bytes, the dtype's size, milliseconds); "
                "ddp_tutorial.performance.stepmodel is refused"),
        worker=dp_comm_time_worker, world_sizes=(1,), init_process_group=False),
]
