"""The memory-bound kernels' bytes (``ddp_tutorial.performance.kernels``) against the bytes a real block's
kernels read and write, counted with a ``TorchDispatchMode`` on lesson 17's ``models.Block``, by hand, and
their place in ``stepmodel.predict`` (issue 39)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from ddp_tutorial.models.transformer import Block
from ddp_tutorial.performance.flops import TransformerShape
from ddp_tutorial.performance.hardware import A100, H100
from ddp_tutorial.performance.kernels import Kernels, kernel_bytes, layer_kernels, memory_bound_seconds
from ddp_tutorial.performance.stepmodel import StepLayout, predict

B, T, D, HEADS = 2, 12, 16, 2  # b t d, b a t t and b t 4d all differ: each kernel's tensors told apart by size
OPS = {"native_layer_norm": "norm", "native_layer_norm_backward": "norm", "_softmax": "softmax",
       "_softmax_backward_data": "softmax", "gelu": "GeLU", "gelu_backward": "GeLU", "add": "residual"}


class KernelBytes(TorchDispatchMode):
    """Bytes of every tensor each op reads and writes, of the size the kernel's table says it touches."""

    def __init__(self, sizes: dict[str, int]):
        super().__init__()
        self.sizes, self.phase = sizes, "forward"
        self.bytes: dict[tuple[str, str], int] = defaultdict(int)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = OPS.get(func.overloadpacket.__name__)
        if name:
            tensors = [t for t in tree_leaves((args, kwargs, out)) if isinstance(t, torch.Tensor)]
            self.bytes[(name, self.phase)] += sum(t.numel() * t.element_size() for t in tensors
                                                  if t.numel() == self.sizes[name])
        return out


def test_kernel_bytes_equal_what_a_blocks_kernels_move():
    torch.manual_seed(0)
    block = Block(D, HEADS, attention="math").to(torch.bfloat16)
    x = torch.randn(B, T, D, dtype=torch.bfloat16, requires_grad=True)
    sizes = {"norm": B * T * D, "softmax": B * HEADS * T * T, "GeLU": B * T * 4 * D, "residual": B * T * D}
    with KernelBytes(sizes) as counted:
        y = block(x)
        counted.phase = "backward"
        y.backward(torch.ones_like(y))
    shape = TransformerShape(vocab=8, dim=D, layers=1, heads=HEADS, seq=T)
    for k in layer_kernels(shape, Kernels(dropout=False)):  # Block at dropout 0; its attention op by op
        assert counted.bytes[(k.name, "forward")] == B * T * k.count * k.elements * k.forward > 0, k.name
        assert counted.bytes[(k.name, "backward")] == B * T * k.count * k.elements * k.backward > 0, k.name


def test_gpt_layer_by_hand():
    # per token and layer, e = 2, GPT with dropout (Megatron-LM's fused kernels): forward 2 norms 2 x 4h,
    # softmax 4as, attention dropout 5as, GeLU 4 x 4h, 2 residual + dropout 2 x 7h = 38h + 9as; backward
    # 2 x 6h + 6as + 5as + 6 x 4h + 2 x 11h = 58h + 11as
    shape = TransformerShape(vocab=51200, dim=2304, layers=24, heads=24, seq=2048)
    h, a_s = 2304, 24 * 2048
    kernels = layer_kernels(shape, Kernels())
    assert sum(k.count * k.elements * k.forward for k in kernels) == 38 * h + 9 * a_s
    assert sum(k.count * k.elements * k.backward for k in kernels) == 58 * h + 11 * a_s
    # one GPU of GPT 1.7B's Megatron run: 16 microbatches of 2048 tokens, 24 layers, recomputed (forward twice)
    layout = StepLayout(dp=32, micro_batches=16, recompute=True)
    total = sum(kernel_bytes(shape, layout, Kernels()).values())
    assert total == pytest.approx(16 * 2048 * 24 * (2 * (38 * h + 9 * a_s) + 58 * h + 11 * a_s))
    assert memory_bound_seconds(shape, layout, A100, Kernels()) == pytest.approx(total / 2.0e12)


def test_tensor_parallelism_splits_the_head_kernels_and_sequence_parallelism_the_rest():
    shape = TransformerShape(vocab=32000, dim=1024, layers=4, heads=16, seq=2048)
    one, tp = kernel_bytes(shape, StepLayout(), Kernels()), kernel_bytes(shape, StepLayout(tp=4), Kernels())
    sp = kernel_bytes(shape, StepLayout(tp=4, sequence_parallel=True), Kernels())
    for name in ("softmax", "attention dropout", "GeLU"):
        assert tp[name] == pytest.approx(one[name] / 4) and sp[name] == pytest.approx(one[name] / 4)
    for name in ("norm", "residual + dropout"):  # Korthikanti's 10 sbh: whole on every TP rank without SP
        assert tp[name] == pytest.approx(one[name]) and sp[name] == pytest.approx(one[name] / 4)


def test_flash_attention_and_no_dropout_leave_the_score_kernels_out():
    llama = TransformerShape(vocab=128256, dim=4096, layers=32, heads=32, seq=8192, kv_heads=8, ffn_hidden=14336,
                             gated=True)
    names = [k.name for k in layer_kernels(llama, Kernels(dropout=False, flash_attention=True))]
    assert names == ["norm", "SwiGLU", "residual"]
    swiglu = layer_kernels(llama, Kernels(dropout=False, flash_attention=True))[1]
    assert (swiglu.elements, swiglu.forward, swiglu.backward) == (14336, 6, 10)  # gate, up -> out; 3 in, 2 out


def test_memory_bound_time_adds_to_the_compute_and_defaults_off():
    shape = TransformerShape(vocab=32000, dim=1024, layers=4, heads=16, seq=2048)
    layout = StepLayout(dp=8, micro_batches=4)
    plain, with_kernels = predict(shape, layout, H100), predict(shape, layout, H100, memory_bound=Kernels())
    assert plain.memory_s == 0.0
    assert with_kernels.memory_s == pytest.approx(memory_bound_seconds(shape, layout, H100, Kernels()))
    assert with_kernels.step_s == pytest.approx(plain.step_s + with_kernels.memory_s)  # DP hidden in both
    # faster memory, less time: H200 is an H100 with 4.8 TB/s instead of 3.35
    faster = predict(shape, layout, replace(H100, hbm_bytes_per_s=4.8e12), memory_bound=Kernels())
    assert faster.memory_s == pytest.approx(with_kernels.memory_s * 3.35 / 4.8)
