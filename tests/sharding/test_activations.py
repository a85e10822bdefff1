"""Activation memory measured two ways (saved-tensor hooks, storages alive after forward) against the formula.

Covers ``ddp_tutorial.sharding.activations``, ``ddp_tutorial.sharding.recompute``,
``ddp_tutorial.models`` (``Block``'s ``dropout`` and ``attention``), ``ddp_tutorial.plots.saved_bytes``.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from ddp_tutorial.models import Block, TinyGPT, TinyTransformer, token_batch
from ddp_tutorial.sharding.activations import block_bytes, block_terms, by_op, saved_tensors
from ddp_tutorial.sharding.recompute import held_after_forward, recompute_blocks, step_flops

# (batch, seq, hidden, heads): heads·seq never 1, 3 or 4 times hidden, so by_op can tell the terms apart
SHAPES = [(3, 12, 32, 4), (1, 16, 24, 3), (2, 5, 8, 1)]


def measured_block(batch: int, seq: int, hidden: int, heads: int, dropout: float, precision: str) -> dict[str, int]:
    torch.manual_seed(0)
    block = Block(hidden, heads, dropout=dropout, attention="math")
    x = torch.randn(batch, seq, hidden, requires_grad=True)
    if precision == "bf16":
        block, x = block.to(torch.bfloat16), x.detach().to(torch.bfloat16).requires_grad_()
    with saved_tensors(block) as record, torch.autocast("cpu", torch.bfloat16, enabled=precision == "autocast"):
        block(x)
    return by_op(record, batch, seq, hidden, heads)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("precision", ["fp32", "bf16", "autocast"])
def test_every_op_saves_what_the_formula_says(shape, precision):
    for dropout in (0.1, 0.0):
        got = measured_block(*shape, dropout, precision)
        copies = got.pop("weight copies", 0)
        want = block_terms(*shape, act_bytes=4 if precision == "fp32" else 2, dropout=dropout > 0,
                           autocast="cpu" if precision == "autocast" else None)
        if precision == "bf16":  # a bf16 LayerNorm keeps its statistics in bf16 too
            want["layer_norm stats"] //= 2
        assert got == want, (shape, precision, dropout)
        hidden = shape[2]
        # autocast saves a bf16 copy of each linear's weight (12 h² values), and only then
        assert copies == (2 * 12 * hidden * hidden if precision == "autocast" else 0)


def test_the_16_bit_formula_is_the_papers():
    b, s, h, a = 2, 64, 32, 4
    paper = s * b * h * (34 + 5 * a * s / h)  # Korthikanti et al. 2022, eq. (1), per layer
    got = block_bytes(b, s, h, a, act_bytes=2, mask_bytes=1) - block_terms(b, s, h, a)["layer_norm stats"]
    assert got == paper


def test_sdpa_keeps_no_seq_squared_term_and_by_op_refuses_ambiguous_shapes():
    x = torch.randn(2, 16, 24, requires_grad=True)
    block = Block(24, 3)
    with saved_tensors(block) as record:
        block(x)
    math_scores = block_terms(2, 16, 24, 3, dropout=False)["softmax (a·s²)"]
    assert record.total == block_bytes(2, 16, 24, 3, dropout=False) - math_scores + 4 * 2 * 3 * 16  # + logsumexp
    with pytest.raises(ValueError, match="1, 3 or 4 times hidden"):
        by_op(record, 2, 8, 16, 2)


def test_checkpointing_keeps_less_and_changes_no_gradient():
    vocab, b, s, h, a, layers = 64, 3, 12, 32, 4, 2
    tokens, targets = token_batch(0, 1, per_rank=b, seq=s, vocab=vocab)
    th = b * s * h * 4
    block = block_bytes(b, s, h, a)
    scores = b * a * s * s * 4
    # keep-matmuls keeps the block input (h), the matmuls' outputs: qkv (3h), probs·v (h), proj (h), up (4h),
    # down (h), and q·kᵀ (a·s²); selective (Korthikanti's) all but the attention core's a·s² terms;
    # full keeps the block input only
    core = sum(v for k, v in block_terms(b, s, h, a).items() if "(a·s²)" in k)
    want = {"none": layers * block, "selective": layers * (block - core), "keep-matmuls": layers * (11 * th + scores),
            "full": layers * th}
    grads, flops = {}, {}
    for mode in want:
        torch.manual_seed(0)
        model = recompute_blocks(TinyGPT(vocab, h, a, layers, dropout=0.1, attention="math"), mode)
        outside = 2 * th + 8 * b * s  # the final norm's input and statistics, the head's input
        assert held_after_forward(model, tokens) == want[mode] + outside, mode

        def step() -> None:
            torch.manual_seed(1)  # the same dropout masks; checkpoint replays the RNG in recompute
            torch.nn.functional.cross_entropy(model(tokens), targets).backward()

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            flops[mode] = step_flops(step)
        grads[mode] = [p.grad.clone() for p in model.parameters()]
    for mode in ("selective", "keep-matmuls", "full"):
        assert all(torch.allclose(g, r, atol=1e-6) for g, r in zip(grads[mode], grads["none"])), mode
    torch.manual_seed(0)
    plain = TinyGPT(vocab, h, a, layers, dropout=0.1, attention="math")
    forward = step_flops(lambda: [blk(torch.randn(b, s, h)) for blk in plain.blocks])
    assert flops["keep-matmuls"] == flops["none"]  # every matmul kept: nothing FLOP-counted is run again
    assert flops["full"] == flops["none"] + forward  # each block's forward once more
    # the attention core's q·kᵀ once more; not probs·v: its output is saved by nothing inside the checkpoint,
    # and a non-reentrant checkpoint stops recomputing once backward has what it needs
    q_k = 2 * b * a * s * s * (h // a)
    assert flops["selective"] == flops["none"] + layers * q_k


def test_block_keywords_keep_the_default_model():
    torch.manual_seed(0)
    old = TinyTransformer()
    torch.manual_seed(0)
    new = TinyGPT(dropout=0.0, attention="math")
    tokens, _ = token_batch(0, 1)
    assert torch.allclose(old(tokens), new(tokens), atol=1e-5)
    with pytest.raises(ValueError, match="sdpa"):
        Block(8, 2, attention="flash")
