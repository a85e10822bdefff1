"""Typical wrong answers to exercises 23.5-23.7 of lesson 23 (How fast, and why: problems at GPU scale), and the
words their diagnosis must contain.

Same format as ``exercise_mistakes``: ``(exercise, source, words, timeout in seconds)``.
``ALSO_RIGHT`` holds other right answers, which must pass.
"""

from __future__ import annotations

from exercise_mistakes import broken

SPLIT = "per_parameter = (weights + grads + optimizer) / (tp * pp)"
FLOOR = "return math.floor((memory_gib - reserve_gib) * 2 ** 30 / per_parameter)"
COMPUTE = "compute = (6 * layer_params + 12 * seq * dim) * tokens / t / matmul_flops"
ALL_REDUCE = "all_reduce = 2 * (t - 1) * latency_s + 2 * (t - 1) / t * activations / link_bytes_per_s"
TRAFFIC = "traffic = 4 * (2 * (t - 1) * latency_s + bytes_sent / link_bytes_per_s)"
KEEP = "        if traffic <= compute:\n            best = t\n"

# 23.5 another way: whole bytes per model copy, over the GPUs
LARGEST_ANOTHER_WAY = '''def largest_model(memory_gib, reserve_gib, gpus, *, tp, pp, zero):
    dp = gpus // (tp * pp)
    copies = {0: 16 * dp, 1: 4 * dp + 12, 2: 2 * dp + 14, 3: 16}[zero]  # bytes per parameter, over the dp copies
    budget = (memory_gib - reserve_gib) * 1024 ** 3
    return int(budget * gpus // copies)
'''
# 23.6 another way: the per-GPU FLOPs and the ring's chunks, term by term
RATIO_ANOTHER_WAY = '''def tp_comm_to_compute(t, dim, seq, *, micro_batch, layer_params, matmul_flops, link_bytes_per_s, latency_s):
    if t == 1:
        return 0.0
    tokens = micro_batch * seq
    forward = (2 * layer_params + 4 * seq * dim) * tokens / t
    compute = 3 * forward / matmul_flops
    chunk = 2 * tokens * dim / t  # bytes of one ring step
    one = 2 * (t - 1) * (latency_s + chunk / link_bytes_per_s)  # reduce-scatter, then all-gather
    return (2 + 2) * one / compute
'''
# 23.7 another way: 23.6's function pasted above, the divisors tried from the top
LIMIT_ANOTHER_WAY = RATIO_ANOTHER_WAY + '''

def tp_limit(dim, seq, heads, *, micro_batch, layer_params, matmul_flops, link_bytes_per_s, latency_s):
    figures = dict(micro_batch=micro_batch, layer_params=layer_params, matmul_flops=matmul_flops,
                   link_bytes_per_s=link_bytes_per_s, latency_s=latency_s)
    for t in (8, 7, 6, 5, 4, 3, 2):
        if heads % t == 0 and tp_comm_to_compute(t, dim, seq, **figures) <= 1:
            return t
    return 1
'''

MISTAKES = {
    "largest_model: ZeRO over all the GPUs": (
        "largest_model", broken("largest_model", "dp = gpus // (tp * pp)", "dp = gpus"),
        ["64 H100s", "ZeRO sharded over all 64 GPUs", "gpus / (tp x pp) = 8 ranks"], 30),
    "largest_model: ZeRO-1 shards the gradients too": (
        "largest_model", broken("largest_model", "(dp if zero >= 2 else 1)", "(dp if zero >= 1 else 1)"),
        ["64 H100s", "ZeRO-1 sharding the gradients too"], 30),
    "largest_model: 4 bytes a parameter (fp32 weights alone)": (
        "largest_model", broken("largest_model", SPLIT, "per_parameter = 4 / (tp * pp)"),
        ["64 H100s", "4 bytes per parameter, as if fp32 weights were all"], 30),
    "largest_model: 12 bytes a parameter (the optimizer alone)": (
        "largest_model", broken("largest_model", SPLIT, "per_parameter = optimizer / (tp * pp)"),
        ["64 H100s", "12 bytes per parameter, the optimizer states alone"], 30),
    "largest_model: GB for GiB": (
        "largest_model", broken("largest_model", "* 2 ** 30 /", "* 1e9 /"),
        ["64 H100s", "GB (10**9 bytes) for GiB"], 30),
    "largest_model: TP and PP forgotten": (
        "largest_model", broken("largest_model", SPLIT, "per_parameter = weights + grads + optimizer"),
        ["64 H100s", "tensor and pipeline parallelism forgotten"], 30),
    "largest_model: PP forgotten": (
        "largest_model", broken("largest_model", SPLIT, SPLIT.replace("(tp * pp)", "tp")),
        ["64 H100s", "the pipeline's split forgotten"], 30),
    "largest_model: the reserve left out": (
        "largest_model", broken("largest_model", "(memory_gib - reserve_gib)", "memory_gib"),
        ["64 H100s", "the reserve left out"], 30),
    "largest_model: rounded to the nearest": (
        "largest_model", broken("largest_model", "math.floor(", "round("),
        ["64 H100s", "rounded to the nearest", "rounded down"], 30),
    "largest_model: the quotient, not rounded down": (
        "largest_model", broken("largest_model", FLOOR, "return (memory_gib - reserve_gib) * 2 ** 30 / per_parameter"),
        ["64 H100s", "the quotient itself: round it down"], 30),
    "largest_model: imports the course's calculator": (
        "largest_model", "from ddp_tutorial.sharding.calculator import bytes_per_rank\n"
        + broken("largest_model", "from __future__ import annotations\n", ""),
        ["NotAllowed", "imports ddp_tutorial.sharding.calculator"], 30),
    "tp_comm_to_compute: the forward's compute against the whole step's traffic": (
        "tp_comm_to_compute", broken("tp_comm_to_compute", COMPUTE, COMPUTE.replace("(6 * layer_params + 12 *",
                                                                                    "(2 * layer_params + 4 *")),
        ["t = 3", "the backward's 2x forgotten on the compute side"], 30),
    "tp_comm_to_compute: the compute not divided by t": (
        "tp_comm_to_compute", broken("tp_comm_to_compute", COMPUTE, COMPUTE.replace(" / t /", " /")),
        ["t = 3", "the compute not divided by t"], 30),
    "tp_comm_to_compute: attention's FLOPs left out": (
        "tp_comm_to_compute", broken("tp_comm_to_compute", COMPUTE, COMPUTE.replace(" + 12 * seq * dim", "")),
        ["t = 3", "attention's 12 s h FLOPs per token"], 30),
    "tp_comm_to_compute: the (t - 1) / t forgotten": (
        "tp_comm_to_compute", broken("tp_comm_to_compute", ALL_REDUCE, ALL_REDUCE.replace("2 * (t - 1) / t *", "2 *")),
        ["t = 3", "the (t - 1) / t forgotten"], 30),
    "tp_comm_to_compute: the backward's all-reduces forgotten": (
        "tp_comm_to_compute", broken("tp_comm_to_compute", "return 4 * all_reduce", "return 2 * all_reduce"),
        ["t = 3", "two all-reduces per layer, the forward's"], 30),
    "tp_comm_to_compute: bits for bytes": (
        "tp_comm_to_compute", broken("tp_comm_to_compute", "activations = 2 *", "activations = 16 *"),
        ["t = 3", "bits for bytes"], 30),
    "tp_comm_to_compute: the latency left out": (
        "tp_comm_to_compute", broken("tp_comm_to_compute", "2 * (t - 1) * latency_s + ", ""),
        ["t = 3", "the latency left out"], 30),
    "tp_comm_to_compute: imports the course's step model": (
        "tp_comm_to_compute", "from ddp_tutorial.performance.stepmodel import tp_seconds\n"
        + broken("tp_comm_to_compute", "from __future__ import annotations\n", ""),
        ["NotAllowed", "imports ddp_tutorial.performance"], 30),
    "tp_limit: a t that does not divide the heads": (
        "tp_limit", broken("tp_limit", "        if heads % t:\n            continue\n", ""),
        ["on B200s", "returned 5, expected 4", "a t that does not divide the 24 heads"], 30),
    "tp_limit: past one node": (
        "tp_limit", broken("tp_limit", "range(2, 9)", "range(2, heads + 1)"),
        ["dim 5120", "expected 8", "a t past 8"], 30),
    "tp_limit: the first t that is communication-bound": (
        "tp_limit", broken("tp_limit", KEEP, "        if traffic > compute:\n            return t\n        best = t\n"),
        ["on B200s", "returned 6, expected 4", "the first t that is communication-bound"], 30),
    "tp_limit: the (t - 1) / t forgotten": (
        "tp_limit", broken("tp_limit", "bytes_sent = 2 * (t - 1) / t * 2", "bytes_sent = 2 * 2"),
        ["on H100s", "the (t - 1) / t forgotten"], 30),
    "tp_limit: the compute not divided by t": (
        "tp_limit", broken("tp_limit", "/ t / matmul_flops", "/ matmul_flops"),
        ["on B200s", "the compute not divided by t"], 30),
    "tp_limit: the latency left out": (
        "tp_limit", broken("tp_limit", TRAFFIC, TRAFFIC.replace("2 * (t - 1) * latency_s + ", "")),
        ["the latency left out"], 30),
}

ALSO_RIGHT = {
    "largest_model: whole bytes per model copy, over the GPUs": ("largest_model", LARGEST_ANOTHER_WAY, 30),
    "tp_comm_to_compute: the ring's chunks, term by term": ("tp_comm_to_compute", RATIO_ANOTHER_WAY, 30),
    "tp_limit: 23.6's function pasted above, from the top": ("tp_limit", LIMIT_ANOTHER_WAY, 30),
}
