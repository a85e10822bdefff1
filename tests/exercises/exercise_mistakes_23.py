"""Typical wrong answers to the exercises of lesson 23 (how fast, and why), and the words their diagnosis must contain.

Same format as ``exercise_mistakes``: ``(exercise, source, words, timeout in seconds)``;
``ALSO_RIGHT`` holds other right answers, which must pass. Each MFU mistake is one seen in public
(torchtitan, nanochat, the HF blog, Primus issues: issue 39).
"""

from __future__ import annotations

from exercise_mistakes import broken

FLOPS = "6 * shape.matmul_params + 12 * shape.layers * shape.seq * shape.dim"
PEAK = "dense_peak = sheet_flops / 2 if sparse else sheet_flops"
MFU_RETURN = "return tokens_per_s * flops_per_token / (gpus * dense_peak)"
BY_HAND = """    d, layers, kv = shape.dim, shape.layers, shape.dim // shape.heads * (shape.kv_heads or shape.heads)
    mlp = (3 if shape.gated else 2) * d * (shape.ffn_hidden or 4 * d)
    n = layers * (2 * d * d + 2 * d * kv + mlp) + d * shape.vocab  # the blocks' linears and the head
    flops_per_token = 6 * n + 12 * layers * shape.seq * d"""
WITH_FLOPS_HELPERS = """    from ddp_tutorial.performance.flops import mfu, training_flops
    per_token = training_flops(shape, tokens=1).model
    return mfu(per_token * tokens_per_s, 1.0, sheet_flops / (2 if sparse else 1), devices=gpus)"""
COMM = "    nbytes = params * BYTES[grad_dtype]"
COMM_BODY = """    steps = 2 * (ranks - 1)  # reduce-scatter, then all-gather
    per_bucket = steps * (latency_s + nbytes / buckets / ranks / bandwidth)
    return buckets * per_bucket"""
CLOSED_FORM = """    share = 2 * (ranks - 1) / ranks  # of the gradient's bytes, sent by each rank
    return buckets * 2 * (ranks - 1) * latency_s + share * nbytes / bandwidth"""

MISTAKES = {
    "MFU: the embedding counted in N": (
        "run_mfu", broken("run_mfu", FLOPS, FLOPS.replace("shape.matmul_params",
                                                          "(shape.matmul_params + shape.embedding_params)")),
        ["GPT-2 XL", "the embedding's vocab x dim parameters counted in N", "a lookup"], 60),
    "MFU: the job's tokens over one GPU's peak": (
        "run_mfu", broken("run_mfu", MFU_RETURN, "return tokens_per_s * flops_per_token / dense_peak"),
        ["GPT-2 XL", "the whole job's tokens/s over ONE GPU's peak", "all 16 GPUs", "above 1"], 60),
    "MFU: the sparsity figure as the peak": (
        "run_mfu", broken("run_mfu", PEAK, "dense_peak = sheet_flops"),
        ["Llama 3 8B", "sparse=True", "the sheet's sparsity figure used as the peak"], 60),
    "MFU: attention's 12 L s h left out": (
        "run_mfu", broken("run_mfu", FLOPS, "6 * shape.matmul_params"),
        ["GPT-2 XL", "attention's 12 L s h per token left out"], 60),
    "MFU: the forward alone (2 N, 4 L s h)": (
        "run_mfu", broken("run_mfu", FLOPS, FLOPS.replace("6 *", "2 *").replace("12 *", "4 *")),
        ["the forward's FLOPs only (2 N per token)", "attention's forward only"], 60),
    "MFU: recomputation counted (8 N: HFU)": (
        "run_mfu", broken("run_mfu", FLOPS, FLOPS.replace("6 *", "8 *").replace("12 *", "16 *")),
        ["8 N: the recomputed forward counted", "HFU", "attention's 16 L s h"], 60),
    "MFU: GPT's 12 L h^2 for a Llama shape": (
        "run_mfu", broken("run_mfu", FLOPS, FLOPS.replace("shape.matmul_params",
                                                          "(12 * shape.layers * shape.dim ** 2 + shape.dim * shape.vocab)")),
        ["Llama 3 8B", "N counted as GPT's 12 L h^2"], 60),
    "all-reduce time: the factor 2 of the all-reduce forgotten": (
        "dp_comm_time", broken("dp_comm_time", "steps = 2 * (ranks - 1)", "steps = ranks - 1"),
        ["8B parameters in bf16", "the bytes of a reduce-scatter alone", "n - 1 latencies per all-reduce"], 60),
    "all-reduce time: 2 S, the (n - 1) / n left out": (
        "dp_comm_time", broken("dp_comm_time", COMM_BODY, CLOSED_FORM.replace("2 * (ranks - 1) / ranks", "2")),
        ["8B parameters in bf16", "each rank sends 2 x the gradients, the (n - 1) / n left out"], 60),
    "all-reduce time: the latency paid once, not per bucket": (
        "dp_comm_time", broken("dp_comm_time", COMM_BODY, CLOSED_FORM.replace("buckets * 2 * (ranks - 1)",
                                                                              "2 * (ranks - 1)")),
        ["8B parameters in bf16", "the latency paid once per step, not once per bucket"], 60),
    "all-reduce time: Gb/s read as GB/s": (
        "dp_comm_time", broken("dp_comm_time", "link_gbps * 1e9 / 8", "link_gbps * 1e9"),
        ["8B parameters in bf16", "Gb/s read as GB/s", "8 bits a byte"], 60),
    "all-reduce time: bf16 gradients counted in fp32": (
        "dp_comm_time", broken("dp_comm_time", COMM, "    nbytes = params * 4"),
        ["8B parameters in bf16", "the gradients counted in fp32", "they are bf16"], 60),
    "all-reduce time: the latency left out": (
        "dp_comm_time", broken("dp_comm_time", COMM_BODY, CLOSED_FORM.replace("buckets * 2 * (ranks - 1) * latency_s + ",
                                                                              "")),
        ["8B parameters in bf16", "the latency left out"], 60),
}

ALSO_RIGHT = {
    "MFU: N counted by hand from the shape": (
        "run_mfu", broken("run_mfu", f"    flops_per_token = {FLOPS}", BY_HAND), 60),
    "MFU: the course's flops.training_flops and flops.mfu": (
        "run_mfu", broken("run_mfu", f"    flops_per_token = {FLOPS}\n    {PEAK}\n    {MFU_RETURN}",
                          WITH_FLOPS_HELPERS), 60),
    "all-reduce time: the closed form, one rank not special-cased": (
        "dp_comm_time", broken("dp_comm_time", COMM_BODY, CLOSED_FORM).replace(
            "    if ranks == 1:\n        return 0.0\n", ""), 60),
}
