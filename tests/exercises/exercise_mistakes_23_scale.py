"""Typical wrong answers to exercises 23.3 and 23.4 of lesson 23 (How fast, and why), and the words their diagnosis must contain.

Same format as ``exercise_mistakes``: ``(exercise, source, words, timeout in seconds)``.
``ALSO_RIGHT`` holds other right answers, which must pass.
"""

from __future__ import annotations

from exercise_mistakes import broken

FLOPS = "flops += forward * (3 if k > 0 else 2)"
SENT = "sent = 2 * (world_size - 1) / world_size * gradient_bytes"
LATENCY = "all_reduce = 2 * (world_size - 1) * latency_s + sent / link_bytes_per_s"
SECONDS = 'return {"flops": flops, "bytes": sent, "seconds": flops / matmul_flops + all_reduce}'
DAYS = "flops = 6 * matmul_params * tokens"
RATE = "seconds = flops / (gpus * mfu * peak_flops)"

# 23.3 written another way: 6 N D less the data's gradient; a reduce-scatter and an all-gather; terms apart
PREDICT_ANOTHER_WAY = '''from __future__ import annotations


def predict_step(sizes, batch, world_size, *, matmul_flops, link_bytes_per_s, latency_s):
    rows = batch // world_size
    weights = sum(i * o for i, o in sizes)
    flops = 6 * weights * rows - 2 * rows * sizes[0][0] * sizes[0][1]  # no gradient for the data
    params = weights + sum(o for _, o in sizes)
    chunk = 4 * params / world_size
    sent = (world_size - 1) * chunk + (world_size - 1) * chunk  # reduce-scatter, then all-gather
    compute = flops / matmul_flops
    latency = (world_size - 1) * latency_s * 2
    return {"flops": flops, "bytes": sent, "seconds": compute + latency + sent / link_bytes_per_s}
'''
# 23.4 written another way: tokens per second of the whole job, then days
DAYS_ANOTHER_WAY = '''def days_to_train(matmul_params, embedding_params, tokens, *, gpus, mfu, peak_flops):
    tokens_per_s = gpus * peak_flops * mfu / (6 * matmul_params)
    return tokens / tokens_per_s / 3600 / 24
'''

MISTAKES = {
    "predict_step: the forward alone (2 N D)": (
        "predict_step", broken("predict_step", FLOPS, "flops += forward"),
        ["world of 2", "'flops' is", "the forward alone: the backward's 2x is missing"], 60),
    "predict_step: the first layer's input gradient counted (6 N D everywhere)": (
        "predict_step", broken("predict_step", FLOPS, "flops += forward * 3"),
        ["world of 2", "the first layer's input gradient counted", "backward is 2x its forward, not 4x"], 60),
    "predict_step: the global batch": (
        "predict_step", broken("predict_step", "rows = batch // world_size", "rows = batch"),
        ["world of 2", "the global batch of 12 rows", "12 / 2 = 6"], 60),
    "predict_step: the all-reduce's factor 2 forgotten": (
        "predict_step", broken("predict_step", SENT, "sent = (world_size - 1) / world_size * gradient_bytes"),
        ["world of 2", "'bytes' is", "the all-reduce's factor 2 forgotten", "reduce-scatter and then an all-gather"],
        60),
    "predict_step: the (n - 1) / n forgotten": (
        "predict_step", broken("predict_step", SENT, "sent = 2 * gradient_bytes"),
        ["world of 2", "the (n - 1) / n forgotten"], 60),
    "predict_step: the buffer once (right on 2 ranks only)": (
        "predict_step", broken("predict_step", SENT, "sent = gradient_bytes"),
        ["world of 3", "the buffer once", "not at n = 3"], 60),
    "predict_step: the biases' gradients left out": (
        "predict_step", broken("predict_step", "d_in * d_out + d_out for", "d_in * d_out for"),
        ["world of 2", "the biases' gradients left out"], 60),
    "predict_step: bits, not bytes": (
        "predict_step", broken("predict_step", "gradient_bytes = 4 * sum", "gradient_bytes = 32 * sum"),
        ["world of 2", "bits, not bytes"], 60),
    "predict_step: the latency left out": (
        "predict_step", broken("predict_step", LATENCY, "all_reduce = sent / link_bytes_per_s"),
        ["world of 2", "'seconds' is", "the latency left out", "2 (n - 1) = 2 steps"], 60),
    "predict_step: the latency paid once": (
        "predict_step", broken("predict_step", LATENCY, "all_reduce = latency_s + sent / link_bytes_per_s"),
        ["world of 2", "the latency paid 1 time:"], 60),
    "predict_step: the link's bytes taken for bits": (
        "predict_step", broken("predict_step", LATENCY, LATENCY.replace("sent / link", "8 * sent / link")),
        ["world of 2", "bits: the bytes times 8"], 60),
    "predict_step: the max rule instead of no overlap": (
        "predict_step", broken("predict_step", SECONDS,
                               'return {"flops": flops, "bytes": sent, "seconds": max(flops / matmul_flops, all_reduce)}'),
        ["world of 2", "the all-reduce alone, as max(compute, all-reduce) gives", "no overlap, add them"], 60),
    "predict_step: imports the course's step model": (
        "predict_step", "from ddp_tutorial.performance.this_machine import linear_flops\n\n\n"
        + broken("predict_step", "from __future__ import annotations\n", ""),
        ["NotAllowed", "imports ddp_tutorial.performance.this_machine"], 60),
    "days_to_train: global FLOPs over one GPU's peak": (
        "days_to_train", broken("days_to_train", RATE, "seconds = flops / (mfu * peak_flops)"),
        ["405B", "the job's FLOPs over ONE GPU's rate: 16,384 GPUs"], 30),
    "days_to_train: the embedding in N": (
        "days_to_train", broken("days_to_train", DAYS, "flops = 6 * (matmul_params + embedding_params) * tokens"),
        ["405B", "the embedding counted in N", "a lookup multiplies nothing"], 30),
    "days_to_train: 2 N D": (
        "days_to_train", broken("days_to_train", DAYS, "flops = 2 * matmul_params * tokens"),
        ["405B", "2 N D: the forward alone"], 30),
    "days_to_train: the recompute counted (8 N D)": (
        "days_to_train", broken("days_to_train", DAYS, "flops = 8 * matmul_params * tokens"),
        ["405B", "8 N D: the recomputed forward counted", "MFU counts model FLOPs only"], 30),
    "days_to_train: seconds": (
        "days_to_train", broken("days_to_train", "return seconds / 86_400", "return seconds"),
        ["405B", "seconds, not days"], 30),
    "days_to_train: hours, with the embedding in N": (
        "days_to_train", broken("days_to_train", "return seconds / 86_400", "return seconds / 3600").replace(
            DAYS, "flops = 6 * (matmul_params + embedding_params) * tokens"),
        ["405B", "the embedding counted in N", "; and hours, not days"], 30),
}

ALSO_RIGHT = {
    "predict_step: 6 N D less the data's gradient, a reduce-scatter and an all-gather": (
        "predict_step", PREDICT_ANOTHER_WAY, 60),
    "days_to_train: the job's tokens per second, then days": ("days_to_train", DAYS_ANOTHER_WAY, 30),
}
