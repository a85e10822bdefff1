"""The roofline of this machine: how many FLOP/s its matmuls reach, how many bytes/s its memory moves,
and where an operation sits between the two (issue 39).

An operation doing ``F`` FLOPs on ``B`` bytes of memory traffic has arithmetic intensity ``F / B``
(FLOPs per byte). It cannot run faster than ``min(peak, intensity x bandwidth)``: below the
*ridge point* ``peak / bandwidth`` it waits for memory, above it for the arithmetic units (Williams,
Waterman and Patterson, "Roofline", CACM 2009). ``peak`` here is the *achievable* one, the best of
several matmul shapes and repeats (as MAMF tables measure a GPU), not a data sheet's.

    >>> round(linear_intensity(batch=1, d_in=1024, d_out=1024, dtype_bytes=4), 3)  # a matrix-vector product
    0.499
    >>> round(linear_intensity(batch=4096, d_in=1024, d_out=1024, dtype_bytes=4))  # a matmul
    228

Measured figures depend on the machine and on what else runs; they are printed, never asserted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ddp_tutorial.timing import timed

__all__ = ["Roofline", "linear_intensity", "norm_intensity", "attainable", "measure_roofline",
           "peak_matmul_rate", "copy_bandwidth"]

MATMUL_SIZES = (256, 512, 1024)  # square matmuls tried; the best rate is the achievable peak


@dataclass(frozen=True)
class Roofline:
    """``peak`` FLOP/s and ``bandwidth`` bytes/s; ``ridge`` FLOPs per byte where the two roofs meet."""

    peak: float
    bandwidth: float

    @property
    def ridge(self) -> float:
        return self.peak / self.bandwidth


def linear_intensity(*, batch: int, d_in: int, d_out: int, dtype_bytes: int) -> float:
    """FLOPs per byte of ``x @ W.T`` for ``x`` (batch, d_in): ``2 b i o`` over reading x and W, writing y."""
    flops = 2 * batch * d_in * d_out
    moved = (batch * d_in + d_in * d_out + batch * d_out) * dtype_bytes
    return flops / moved


def norm_intensity(*, rows: int, dim: int, dtype_bytes: int, flops_per_element: int = 8) -> float:
    """A layer norm reads and writes each element once and does a few FLOPs on it (about 8: mean,
    variance, normalise, scale, shift): far left of any ridge, whatever its size."""
    return rows * dim * flops_per_element / (2 * rows * dim * dtype_bytes)


def attainable(roofline: Roofline, intensity: float) -> float:
    """The most FLOP/s an operation of this intensity can reach: ``min(peak, intensity x bandwidth)``."""
    if intensity <= 0:
        raise ValueError(f"arithmetic intensity must be positive, got {intensity}")
    return min(roofline.peak, intensity * roofline.bandwidth)


def peak_matmul_rate(sizes: Sequence[int] = MATMUL_SIZES, *, repeat: int = 5,
                     dtype: torch.dtype = torch.float32) -> float:
    """The achievable matmul rate, FLOP/s: the best over ``sizes`` (n x n times n x n) and ``repeat`` runs."""
    best = 0.0
    for n in sizes:
        a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
        best = max(best, 2 * n ** 3 / timed(lambda: torch.mm(a, b), repeat=repeat))
    return best


def copy_bandwidth(numel: int = 1 << 24, *, repeat: int = 5) -> float:
    """Memory bandwidth, bytes/s: a float32 copy of ``numel`` elements (64 MiB by default, larger than
    any cache) reads and writes each byte once."""
    src, dst = torch.randn(numel), torch.empty(numel)
    return 2 * src.nbytes / timed(lambda: dst.copy_(src), repeat=repeat)


def measure_roofline(*, repeat: int = 5) -> Roofline:
    """This machine's roofline: ``peak_matmul_rate`` and ``copy_bandwidth`` on the threads torch uses now."""
    return Roofline(peak=peak_matmul_rate(repeat=repeat), bandwidth=copy_bandwidth(repeat=repeat))
