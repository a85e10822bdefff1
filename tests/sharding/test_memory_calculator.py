"""The memory calculator against bytes measured from real tensors (Korthikanti's Table 2: test_korthikanti.py).

Covers ``ddp_tutorial.sharding.calculator``.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from ddp_tutorial.launch import spawn
from ddp_tutorial.models import TinyGPT, TinyTransformer, token_batch
from ddp_tutorial.sharding.calculator import PRECISIONS, PRESETS, ModelShape, bytes_per_rank, main, num_params
from ddp_tutorial.sharding.fsdp import all_footprints
from ddp_tutorial.sharding.recompute import MODES, held_after_forward, recompute_blocks

# (vocab, batch, seq, hidden, heads, layers)
SHAPES = [(64, 3, 12, 32, 4, 2), (50, 1, 16, 24, 3, 3)]


@pytest.mark.parametrize("vocab, batch, seq, hidden, heads, layers", SHAPES)
def test_activations_equal_the_bytes_forward_leaves_alive(vocab, batch, seq, hidden, heads, layers):
    shape = ModelShape.course(vocab=vocab, dim=hidden, heads=heads, layers=layers, seq=seq)
    tokens, targets = token_batch(0, 1, per_rank=batch, seq=seq, vocab=vocab)
    assert sum(p.numel() for p in TinyTransformer(vocab, hidden, heads, layers).parameters()) == \
        num_params(shape)[0] * layers + num_params(shape)[1]
    for attention, dropout in (("math", 0.1), ("math", 0.0), ("sdpa", 0.0)):
        for recompute in MODES:
            if attention == "sdpa" and recompute == "keep-matmuls":
                continue  # the fused kernel is not a matmul to the policy: recomputed whole
            torch.manual_seed(0)
            model = TinyGPT(vocab, hidden, heads, layers, dropout=dropout, attention=attention)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)
                got = held_after_forward(recompute_blocks(model, recompute), tokens, targets=targets)
            want = bytes_per_rank(shape, micro_batch=batch, precision="fp32", recompute=recompute, dropout=dropout > 0,
                                  attention="flash" if attention == "sdpa" else "math")
            assert got == want["activations"], (attention, dropout, recompute)


def test_model_states_equal_what_ddp_zero_and_fsdp2_ranks_hold():
    measured = spawn(all_footprints, 2, timeout=120)
    shape = ModelShape.course()
    strategies = {"DDP": 0, "ZeRO-1": 1, "ZeRO-2": 2, "FSDP2": 3}
    for strategy, zero in strategies.items():
        want = bytes_per_rank(shape, dp=2, zero=zero, precision="fp32")
        for rank in measured:
            got = rank[strategy]
            assert (got.params, got.grads, got.optim) == \
                (want["parameters"], want["gradients"], want["optimizer states"]), strategy


def test_llama_8b_as_the_playbook_prints_it(capsys):
    layer, outside = num_params(PRESETS["llama-8b"])
    assert round((32 * layer + outside) / 1e9, 2) == 8.03
    one = bytes_per_rank(PRESETS["llama-8b"])
    assert one["parameters"] == one["gradients"] == 2 * (32 * layer + outside)  # bf16, 2 bytes each
    assert one["optimizer states"] == 12 * (32 * layer + outside)
    zero3 = bytes_per_rank(PRESETS["llama-8b"], dp=8, zero=3)
    assert zero3["parameters"] * 8 >= one["parameters"] and zero3["total"] < one["total"]
    full = bytes_per_rank(PRESETS["llama-8b"], recompute="full")["activations"]
    assert full < bytes_per_rank(PRESETS["llama-8b"], recompute="keep-matmuls")["activations"] < one["activations"]
    # with a fused kernel Korthikanti's selective recomputes only the log-sum-exp: 4 bytes per query and head
    selective = bytes_per_rank(PRESETS["llama-8b"], recompute="selective")["activations"]
    assert one["activations"] - selective == 32 * 4 * 32 * 4096
    tp = bytes_per_rank(PRESETS["llama-8b"], tp=8)
    assert tp["activations"] * 8 == pytest.approx(one["activations"], rel=1e-6)
    main(["--model", "llama-8b", "--dp", "8", "--zero", "1", "--recompute", "full"])
    out = capsys.readouterr().out
    assert "8.03e9 parameters" in out and "activations" in out and "GiB" in out
    main(["--model", "llama-8b", "--tp", "8", "--no-sp", "--recompute", "selective", "--precision", "megatron-bf16"])
    assert "tp 8 (no sp)" in capsys.readouterr().out
    with pytest.raises(ValueError, match="zero must be 0-3"):
        bytes_per_rank(PRESETS["tiny"], zero=4)


def test_bytes_per_parameter_as_each_stack_holds_them():
    llama = PRESETS["llama-8b"]
    layer, outside = num_params(llama)
    n = 32 * layer + outside
    states = {name: sum(bytes_per_rank(llama, precision=name)[k] for k in ("parameters", "gradients",
                                                                           "optimizer states"))
              for name in PRECISIONS}
    # ZeRO §3.1's 2 + 2 + 12, Megatron's fp32 main_grad (+2), FSDP2's fp32 shards with fp32 grads (4 + 4 + 8)
    assert states == {"fp32": 16 * n, "bf16-mixed": 16 * n, "megatron-bf16": 18 * n, "fsdp2-bf16": 16 * n}
    # the review's "about 15 GiB more for 8B" under Megatron's layout
    assert round((states["megatron-bf16"] - states["bf16-mixed"]) / 2**30) == 15
    fsdp2 = bytes_per_rank(llama, precision="fsdp2-bf16", dp=8, zero=3)
    assert fsdp2["parameters"] == fsdp2["gradients"] == -(-4 * n // 8)  # fp32 shards, no bf16 copy kept
    assert fsdp2["activations"] == bytes_per_rank(llama)["activations"]  # bf16 compute: 2-byte activations


def test_zero_shards_model_state_over_dp_times_cp():
    """The cp ranks of a replica hold the same weights, so ZeRO/FSDP shards over dp x cp (torchtitan's
    dp_shard_cp): by hand from Llama 3 8B's 8.03e9 parameters and the ZeRO paper's 2 + 2 + 12 bytes each."""
    layer, outside = num_params(PRESETS["llama-8b"])
    psi = 32 * layer + outside
    for dp, cp in ((8, 1), (2, 4), (1, 8)):
        three = bytes_per_rank(PRESETS["llama-8b"], dp=dp, cp=cp, zero=3)
        assert (three["parameters"], three["gradients"], three["optimizer states"]) == \
            (-(-2 * psi // 8), -(-2 * psi // 8), -(-12 * psi // 8)), (dp, cp)
        one = bytes_per_rank(PRESETS["llama-8b"], dp=dp, cp=cp, zero=1)
        assert (one["parameters"], one["optimizer states"]) == (2 * psi, -(-12 * psi // 8)), (dp, cp)
    # cp still divides the activations' tokens, which dp does not
    assert bytes_per_rank(PRESETS["llama-8b"], cp=8)["activations"] < bytes_per_rank(PRESETS["llama-8b"], dp=8)["activations"]
