"""The memory calculator against bytes measured from real tensors, and mixed precision's bytes and limits.

Covers ``ddp_tutorial.sharding.calculator``, ``ddp_tutorial.sharding.precision``.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from ddp_tutorial.launch import spawn
from ddp_tutorial.models import TinyGPT, TinyTransformer, token_batch
from ddp_tutorial.sharding.calculator import PRESETS, ModelShape, bytes_per_rank, main, num_params
from ddp_tutorial.sharding.fsdp import all_footprints
from ddp_tutorial.sharding.precision import MasterWeights, breaking_points, scaled_gradients, train_losses
from ddp_tutorial.sharding.recompute import held_after_forward, recompute_blocks

# (vocab, batch, seq, hidden, heads, layers)
SHAPES = [(64, 3, 12, 32, 4, 2), (50, 1, 16, 24, 3, 3)]


@pytest.mark.parametrize("vocab, batch, seq, hidden, heads, layers", SHAPES)
def test_activations_equal_the_bytes_forward_leaves_alive(vocab, batch, seq, hidden, heads, layers):
    shape = ModelShape.course(vocab=vocab, dim=hidden, heads=heads, layers=layers, seq=seq)
    tokens, targets = token_batch(0, 1, per_rank=batch, seq=seq, vocab=vocab)
    assert sum(p.numel() for p in TinyTransformer(vocab, hidden, heads, layers).parameters()) == \
        num_params(shape)[0] * layers + num_params(shape)[1]
    for attention, dropout in (("math", 0.1), ("math", 0.0), ("sdpa", 0.0)):
        for recompute in ("none", "selective", "full"):
            if attention == "sdpa" and recompute == "selective":
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
    assert full < bytes_per_rank(PRESETS["llama-8b"], recompute="selective")["activations"] < one["activations"]
    tp = bytes_per_rank(PRESETS["llama-8b"], tp=8)
    assert tp["activations"] * 8 == pytest.approx(one["activations"], rel=1e-6)
    main(["--model", "llama-8b", "--dp", "8", "--zero", "1", "--recompute", "full"])
    out = capsys.readouterr().out
    assert "8.03e9 parameters" in out and "activations" in out and "GiB" in out
    with pytest.raises(ValueError, match="zero must be 0-3"):
        bytes_per_rank(PRESETS["tiny"], zero=4)


def test_mixed_precision_is_2_2_12_bytes_per_parameter_measured():
    trainer = MasterWeights(TinyTransformer())
    tokens, targets = token_batch(0, 1)
    torch.nn.functional.cross_entropy(trainer.work(tokens), targets).backward()
    trainer.step()
    n = sum(p.numel() for p in trainer.master.parameters())
    assert trainer.bytes() == {"bf16 parameters": 2 * n, "bf16 gradients": 2 * n, "fp32 master parameters": 4 * n,
                               "Adam moments (fp32)": 8 * n}
    # the working copy is the masters rounded to bf16
    assert all(torch.equal(w, m.to(torch.bfloat16)) for w, m in zip(trainer.work.parameters(), trainer.master.parameters()))


def test_where_each_format_breaks_and_loss_scaling():
    got = breaking_points()
    assert got["70000 (an activation past fp16's max)"]["float16"] == float("inf")
    assert got["1e-8 (a small gradient)"]["float16"] == 0.0 and got["1e-8 (a small gradient)"]["bfloat16"] > 0
    assert got["1 + 0.001 (a weight plus its update)"]["bfloat16"] == 1.0
    assert got["257 (an integer past bf16's 8 bits)"]["bfloat16"] == 256.0
    assert scaled_gradients(None)["grad"] == 0.0  # underflowed in fp16
    assert scaled_gradients(2.0**14)["grad"] == pytest.approx(1e-8, rel=1e-3)
    assert not scaled_gradients(2.0**17)["finite"]  # the scaled gradient overflowed fp16


def test_bf16_autocast_loss_follows_fp32():
    fp32, bf16 = train_losses(8), train_losses(8, autocast=True)
    assert max(abs(a - b) for a, b in zip(fp32, bf16)) < 0.02
    assert fp32 != bf16  # bf16 really ran


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
