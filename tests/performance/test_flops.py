"""The FLOPs formulas against torch's own counter, on the course's two decoders (issue 39)."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode, flop_registry

from ddp_tutorial.doctor import older_than
from ddp_tutorial.models.gpt import CharGPT
from ddp_tutorial.models.llama import TinyLlama
from ddp_tutorial.performance.flops import TransformerShape, forward_flops, mfu, training_flops

BATCH, SEQ = 3, 16
CPU_SDPA = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
# torch's counter has an entry for the CPU attention kernel from 2.15 on; before (2.9 to 2.14.1 seen), it
# counts that kernel's matmuls as nothing. Lesson 23 counts attention with SDPBackend.MATH, which every
# release counts (its bmm), and shows the fused kernel's count in an ignore-output cell for that reason.
COUNTS_CPU_ATTENTION = CPU_SDPA in flop_registry


def counted(model: torch.nn.Module, vocab: int, *, backward: bool) -> dict[str, int]:
    """What ``FlopCounterMode`` counts for one forward (and backward) of a (BATCH, SEQ) batch, by kind."""
    tokens = torch.randint(0, vocab, (BATCH, SEQ), generator=torch.Generator().manual_seed(0))
    with FlopCounterMode(display=False) as counter:
        out = model(tokens)
        if backward:
            out.float().pow(2).mean().backward()
    by_op = {str(op): n for op, n in counter.get_flop_counts()["Global"].items()}
    attention = sum(n for op, n in by_op.items() if "scaled_dot_product" in op)
    return {"matmul": counter.get_total_flops() - attention, "attention": attention}


def test_the_registry_counts_cpu_attention_from_torch_2_15_on():
    # the branch below is taken before 2.15 only: from 2.15 on the attention term is checked
    assert COUNTS_CPU_ATTENTION or older_than(torch.__version__, "2.15")


def test_attention_as_plain_matmuls_is_counted_by_every_release():
    """What lesson 23 relies on: with SDPBackend.MATH the counter sees exactly the model's FLOPs."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    shape = TransformerShape(vocab=32, dim=32, layers=2, heads=4, seq=SEQ)
    with sdpa_kernel(SDPBackend.MATH):
        got = counted(CharGPT(32, 32, 4, 2), 32, backward=True)
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        tokens = torch.randint(0, 32, (BATCH, SEQ), generator=torch.Generator().manual_seed(0))
        CharGPT(32, 32, 4, 2)(tokens).float().pow(2).mean().backward()
    by_op = {str(op): n for op, n in counter.get_flop_counts()["Global"].items()}
    flops = training_flops(shape, BATCH * SEQ)
    assert counter.get_total_flops() == flops.model == got["matmul"]
    # Q K^T and P V, forward and backward: batch x heads x (s x s x head_dim) x 2 FLOPs x 2 products x 3
    assert by_op["aten.bmm"] == flops.attention == BATCH * 4 * SEQ * SEQ * (32 // 4) * 2 * 2 * 3 * 2


@pytest.mark.parametrize("backward", [False, True], ids=["forward", "training step"])
def test_gpt_flops_equal_the_counter(backward):
    vocab, dim, heads, layers = 32, 32, 4, 2
    shape = TransformerShape(vocab=vocab, dim=dim, layers=layers, heads=heads, seq=SEQ)
    got = counted(CharGPT(vocab, dim, heads, layers), vocab, backward=backward)
    tokens = BATCH * SEQ
    flops = training_flops(shape, tokens, flash_backward=True) if backward else forward_flops(shape, tokens)
    assert got["matmul"] == flops.matmul
    if COUNTS_CPU_ATTENTION:
        # the counter counts hardware FLOPs: flash attention's backward recomputes Q K^T
        assert got["attention"] == flops.hardware - flops.matmul
        if backward:
            assert got["attention"] > flops.attention  # more than the model's 12 L s d per token


def test_the_parameter_count_is_the_models_linear_weights():
    shape = TransformerShape(vocab=32, dim=32, layers=2, heads=4, seq=SEQ)
    model = CharGPT(32, 32, 4, 2)
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    assert shape.matmul_params == linear
    assert shape.embedding_params == model.tok_embeddings.weight.numel()


def test_llama_shape_gqa_and_swiglu_equal_the_counter():
    vocab, dim, heads, kv_heads, layers = 40, 32, 8, 2, 2
    model = TinyLlama(vocab, dim, heads, layers, kv_heads=kv_heads)
    shape = TransformerShape(vocab=vocab, dim=dim, layers=layers, heads=heads, seq=SEQ, kv_heads=kv_heads,
                             ffn_hidden=4 * dim, gated=True)
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    assert shape.matmul_params == linear
    got = counted(model, vocab, backward=False)
    assert got["matmul"] == forward_flops(shape, BATCH * SEQ).matmul


def test_recomputation_is_hardware_flops_not_model_flops():
    shape = TransformerShape(vocab=32, dim=32, layers=2, heads=4, seq=SEQ)
    plain, again = training_flops(shape, 48), training_flops(shape, 48, recompute=True)
    assert again.model == plain.model  # what the model needs did not change
    assert again.hardware - plain.hardware == forward_flops(shape, 48).model  # one forward more


def test_mfu_is_over_every_device_of_the_job():
    # 8 devices at 100 FLOP/s each ran 4000 model FLOPs in 10 s: 400 FLOP/s of 800 possible
    assert mfu(4000, 10, 100, devices=8) == 0.5
    assert mfu(4000, 10, 100) == 4.0  # the global count over one device's peak: "400% MFU"
    with pytest.raises(ValueError, match="must be positive"):
        mfu(4000, 0, 100)


def test_a_shape_that_does_not_divide_is_refused():
    with pytest.raises(ValueError, match="do not divide evenly"):
        TransformerShape(vocab=32, dim=30, layers=1, heads=4, seq=8)
    with pytest.raises(ValueError, match="seq must be at least 1"):
        TransformerShape(vocab=32, dim=32, layers=1, heads=4, seq=0)


# Llama 3's published shapes (Meta's params.json / config.json: dim, n_layers, n_heads, n_kv_heads,
# ffn hidden, vocab 128,256) and their published sizes: Llama 3.1 8B has 8.03B parameters (its model
# card), 405B has 405B ("The Llama 3 Herd of Models", Table 3). Norm weights are the small rest.
LLAMA3 = {
    "8B": (TransformerShape(vocab=128_256, dim=4096, layers=32, heads=32, kv_heads=8, ffn_hidden=14_336,
                            gated=True, seq=8192), 8.03e9),
    "405B": (TransformerShape(vocab=128_256, dim=16_384, layers=126, heads=128, kv_heads=8, ffn_hidden=53_248,
                              gated=True, seq=8192), 405e9),
}


@pytest.mark.parametrize("name", LLAMA3)
def test_llama3_parameter_counts_match_the_published_sizes(name):
    shape, published = LLAMA3[name]
    total = shape.matmul_params + shape.embedding_params
    assert abs(total - published) / published < 0.005, (name, total)
