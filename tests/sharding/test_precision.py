"""Mixed precision measured: bytes per parameter (between steps and inside ``step()``), limits, loss scaling, learning.

Covers ``ddp_tutorial.sharding.precision``.
"""

from __future__ import annotations

import pytest
import torch

from ddp_tutorial.models import TinyTransformer, token_batch
from ddp_tutorial.sharding.precision import CURVES, MasterWeights, breaking_points, learning_curves, scaled_gradients


def trained(main_grad: bool) -> tuple[MasterWeights, int]:
    trainer = MasterWeights(TinyTransformer(), main_grad=main_grad)
    tokens, targets = token_batch(0, 1)
    for _ in range(2):
        torch.nn.functional.cross_entropy(trainer.work(tokens), targets).backward()
        trainer.step()
    return trainer, sum(p.numel() for p in trainer.master.parameters())


def test_master_weights_hold_2_2_12_between_steps_and_4_more_inside_step():
    trainer, n = trained(main_grad=False)
    assert trainer.bytes() == {"bf16 parameters": 2 * n, "bf16 gradients": 2 * n, "fp32 gradients": 0,
                               "fp32 master parameters": 4 * n, "Adam moments (fp32)": 8 * n}
    # inside step(): the float32 copies of the gradients too, 20 bytes per parameter
    assert trainer.peak["fp32 gradients"] == 4 * n and sum(trainer.peak.values()) == 20 * n
    # the working copy is the masters rounded to bf16
    assert all(torch.equal(w, m.to(torch.bfloat16)) for w, m in zip(trainer.work.parameters(), trainer.master.parameters()))


def test_megatron_main_grad_is_18_bytes_and_steps_like_the_plain_copy():
    megatron, n = trained(main_grad=True)
    assert megatron.bytes() == {"bf16 parameters": 2 * n, "bf16 gradients": 0, "fp32 main_grad": 4 * n,
                                "fp32 master parameters": 4 * n, "Adam moments (fp32)": 8 * n}
    assert sum(megatron.peak.values()) == 18 * n  # the step reads the buffers: no copy on top
    torch.manual_seed(0)
    plain, _ = trained(main_grad=False)
    torch.manual_seed(0)
    megatron, _ = trained(main_grad=True)
    for a, b in zip(plain.master.parameters(), megatron.master.parameters()):
        assert torch.allclose(a, b, atol=1e-6)  # one backward per step: the same fp32 gradient either way


def test_where_each_format_breaks_and_loss_scaling():
    got = breaking_points()
    assert got["70000 (an activation past fp16's max)"]["float16"] == float("inf")
    assert got["1e-8 (a small gradient)"]["float16"] == 0.0 and got["1e-8 (a small gradient)"]["bfloat16"] > 0
    assert got["1 + 0.001 (a weight plus its update)"]["bfloat16"] == 1.0
    assert got["257 (an integer past bf16's 8 bits)"]["bfloat16"] == 256.0
    assert scaled_gradients(None)["grad"] == 0.0  # underflowed in fp16
    default = scaled_gradients(2.0**16)  # GradScaler's own init_scale: the float32 loss does not overflow
    assert default["grad"] == pytest.approx(1e-8, rel=1e-3) and default["next scale"] == 2.0**16
    over = scaled_gradients(2.0**30)  # 1e-4 x 2**30 > 65504: the fp16 gradient of y overflows
    assert not over["finite"] and over["next scale"] == 2.0**29  # the step skipped, the scale halved


def test_fp32_masters_learn_a_fixed_batch_and_bf16_weights_stall():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # 90 small steps: one thread is the fastest on a loaded machine
    try:
        curves = learning_curves(30)
    finally:
        torch.set_num_threads(threads)
    assert list(curves) == list(CURVES)
    fp32, autocast, bf16 = (curves[k] for k in CURVES)
    fell = fp32[0] - fp32[-1]
    assert fell > 0.08 and all(b < a for a, b in zip(fp32, fp32[1:]))  # learnable: it falls every step
    assert max(abs(a - b) for a, b in zip(fp32, autocast)) < 0.01  # the masters in float32: the same curve
    assert bf16[0] - bf16[-1] < fell / 3  # updates below half a bf16 spacing round away
