"""The roofline's byte and FLOP counts against torch's, and its shape (never this machine's speed)."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from ddp_tutorial.performance.roofline import Roofline, attainable, linear_intensity, measure_roofline


class Touched(TorchDispatchMode):
    """The bytes of every tensor each matmul kernel reads or writes (views, which move nothing, left out)."""

    def __init__(self):
        super().__init__()
        self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001  (torch's protocol)
        out = func(*args, **(kwargs or {}))
        if func.overloadpacket not in (torch.ops.aten.mm, torch.ops.aten.addmm):
            return out
        flat = [*args, *(kwargs or {}).values(), *(out if isinstance(out, (tuple, list)) else [out])]
        self.bytes += sum(t.nbytes for t in flat if isinstance(t, torch.Tensor))
        return out


@pytest.mark.parametrize("batch", [1, 7, 64])
def test_linear_intensity_is_the_counted_flops_over_the_touched_bytes(batch):
    x, w = torch.randn(batch, 24), torch.randn(40, 24)
    with FlopCounterMode(display=False) as flops, Touched() as touched:
        torch.nn.functional.linear(x, w)
    # F.linear runs one mm on x, W (through its transposed view) and y
    want = flops.get_total_flops() / touched.bytes
    got = linear_intensity(batch=batch, d_in=24, d_out=40, dtype_bytes=4)
    assert got == pytest.approx(want)


def test_intensity_grows_with_the_batch_towards_the_weights_limit():
    seen = [linear_intensity(batch=b, d_in=512, d_out=512, dtype_bytes=2) for b in (1, 16, 256, 4096, 1 << 20)]
    assert seen == sorted(seen)
    # a matrix-vector product is below 1 FLOP per byte; a huge batch tends to 2 i o / ((i + o) 2 bytes)
    assert seen[0] < 1 < seen[-1] < 2 * 512 * 512 / ((512 + 512) * 2)


def test_attainable_is_the_lower_roof():
    roof = Roofline(peak=100.0, bandwidth=10.0)
    assert roof.ridge == 10.0
    assert attainable(roof, 2.0) == 20.0  # memory-bound: 2 FLOPs per byte at 10 bytes/s
    assert attainable(roof, 50.0) == 100.0  # compute-bound
    with pytest.raises(ValueError, match="must be positive"):
        attainable(roof, 0)


def test_the_measured_roofline_is_finite_and_positive():
    roof = measure_roofline(repeat=1)
    assert 0 < roof.peak < float("inf") and 0 < roof.bandwidth < float("inf")
