"""ddp_tutorial.comm.ring: ring_all_reduce gives what dist.all_reduce gives (the DESIGN contract)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.distributed import ReduceOp

from ddp_tutorial.comm.ring import SUPPORTED_OPS, ring_all_reduce, ring_all_reduce_flat, ring_trace, segment_bounds
from ddp_tutorial.launch import spawn

NUMELS = [0, 1, 7, 100_003]
DTYPES = [torch.float32, torch.float64, torch.int64]


def make_input(rank: int, numel: int, dtype: torch.dtype, op) -> torch.Tensor:
    """Small whole numbers: sums and products are exact, so results must match bit for bit."""
    g = torch.Generator().manual_seed(1000 * rank + numel)
    low, high = (-2, 3) if op == ReduceOp.PRODUCT else (-50, 51)
    return torch.randint(low, high, (numel,), generator=g).to(dtype)


def reference(x: torch.Tensor, op, group=None) -> torch.Tensor:
    """dist.all_reduce; AVG as SUM / n where the backend has no AVG (older gloo)."""
    try:
        dist.all_reduce(x, op, group=group)
    except (RuntimeError, ValueError):
        if op != ReduceOp.AVG or not x.is_floating_point():
            raise
        dist.all_reduce(x, ReduceOp.SUM, group=group)
        x.div_(dist.get_world_size(group))
    return x


def compare_worker(rank: int, world_size: int) -> list[str]:
    """Every op x numel x dtype; returns the mismatches (and a checksum of what rank holds)."""
    problems = []
    for numel in NUMELS:
        for dtype in DTYPES:
            for op in SUPPORTED_OPS:
                x = make_input(rank, numel, dtype, op)
                if op == ReduceOp.AVG and dtype == torch.int64:
                    with pytest.raises(TypeError, match="AVG"):
                        ring_all_reduce(x, op)
                    continue
                expected = reference(x.clone(), op)
                got = ring_all_reduce(x, op)
                if got is not x:
                    problems.append(f"{op.name} {dtype} {numel}: not in place")
                if not torch.equal(got, expected):
                    problems.append(f"{op.name} {dtype} numel={numel}: {got[:5].tolist()} != "
                                    f"{expected[:5].tolist()}")
    return problems


def random_float_worker(rank: int, world_size: int) -> tuple[list, bool]:
    """Random floats (sums differ in rounding only) in a 2-D tensor; returns the result and shape check."""
    x = torch.randn(33, 17, generator=torch.Generator().manual_seed(rank))
    expected = reference(x.clone(), ReduceOp.SUM)
    ring_all_reduce(x)
    return x.flatten().tolist(), torch.allclose(x, expected, atol=1e-5) and x.shape == (33, 17)


def pipelining_worker(rank: int, world_size: int) -> list[str]:
    """Tiny pieces and every look-ahead depth: many messages per segment must still line up."""
    problems = []
    for depth in (0, 1, 3):
        for dtype in (torch.float64, torch.int64, torch.bfloat16):
            for op in (ReduceOp.SUM, ReduceOp.MAX):
                x = make_input(rank, 1001, dtype, op)
                expected = reference(x.clone(), op)
                ring_all_reduce_flat(x, op, None, piece_bytes=48, depth=depth)
                if not torch.equal(x, expected):
                    problems.append(f"depth={depth} {dtype} {op.name}")
    return problems


def other_dtypes_worker(rank: int, world_size: int) -> list[str]:
    """bool, uint8, int32, float16, bfloat16: equal where gloo answers, else refused too."""
    problems = []
    for dtype in (torch.bool, torch.uint8, torch.int32, torch.float16, torch.bfloat16):
        for op in SUPPORTED_OPS:
            g = torch.Generator().manual_seed(rank)
            x = torch.randint(0, 3, (11,), generator=g).to(dtype)
            expected = x.clone()
            try:
                dist.all_reduce(expected, op)
            except (RuntimeError, ValueError):
                expected = None
            try:
                ring_all_reduce(x, op)
            except TypeError:
                if expected is not None:
                    problems.append(f"{dtype} {op.name}: refused, but dist.all_reduce answers")
                continue
            if expected is None:
                problems.append(f"{dtype} {op.name}: answered, but dist.all_reduce refuses")
            elif not torch.equal(x, expected):
                problems.append(f"{dtype} {op.name}: {x.tolist()} != {expected.tolist()}")
    return problems


def make_complex_input(rank: int, numel: int, dtype: torch.dtype) -> torch.Tensor:
    """Small whole real and imaginary parts, none of them all zero: products stay exact."""
    g = torch.Generator().manual_seed(rank)
    real = torch.randint(-3, 4, (numel,), generator=g).double()
    imag = torch.randint(-3, 4, (numel,), generator=g).double()
    return torch.complex(real, imag).to(dtype)


def complex_worker(rank: int, world_size: int) -> list[str]:
    """Complex SUM/AVG against dist.all_reduce; PRODUCT (gloo refuses it) against the product of
    every rank's input, rebuilt here from the ranks' seeds and multiplied in one process."""
    problems = []
    for dtype in (torch.complex64, torch.complex128):
        for numel in (2, 11, 1001):  # fewer elements than ranks, a few, many pieces
            x = make_complex_input(rank, numel, dtype)
            if not (x.imag != 0).any() or not (x.real != 0).any():
                problems.append(f"{dtype} {numel}: input has no imaginary (or real) part")
            for op in (ReduceOp.SUM, ReduceOp.AVG):
                expected = x.clone()
                dist.all_reduce(expected, op)
                got = x.clone()
                ring_all_reduce_flat(got, op, None, piece_bytes=64)
                if not torch.equal(got, expected):
                    problems.append(f"{dtype} {op.name} {numel}: {got[:3].tolist()} != {expected[:3].tolist()}")
            expected = make_complex_input(0, numel, torch.complex128)
            for r in range(1, world_size):
                expected = expected * make_complex_input(r, numel, torch.complex128)
            with pytest.raises(ValueError, match="PRODUCT"):  # the one op the ring adds to gloo's
                dist.all_reduce(x.clone(), ReduceOp.PRODUCT)
            got = x.clone()
            ring_all_reduce_flat(got, ReduceOp.PRODUCT, None, piece_bytes=64)
            if not torch.equal(got, expected.to(dtype)):
                problems.append(f"{dtype} PRODUCT {numel}: {got[:3].tolist()} != {expected[:3].tolist()}")
            for op in (ReduceOp.MIN, ReduceOp.MAX):  # refused, as by gloo
                with pytest.raises(TypeError, match="complex"):
                    ring_all_reduce(x.clone(), op)
                with pytest.raises(ValueError, match=op.name):
                    dist.all_reduce(x.clone(), op)
    return problems


def subgroup_worker(rank: int, world_size: int) -> list[float]:
    """A ring over ranks 1..n-1 only; rank 0 is not a member and keeps its tensor."""
    group = dist.new_group(list(range(1, world_size)))
    x = torch.arange(5, dtype=torch.float64) + 10 * rank
    expected = x.clone() if rank == 0 else reference(x.clone(), ReduceOp.SUM, group)
    ring_all_reduce(x, group=group)
    assert torch.equal(x, expected), (x, expected)
    return x.tolist()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_ring_equals_dist_all_reduce_for_every_op_numel_and_dtype(world_size):
    assert spawn(compare_worker, world_size, backend="gloo", timeout=90) == [[]] * world_size


@pytest.mark.timeout(60)
def test_world_of_one_leaves_the_tensor_alone():
    assert spawn(compare_worker, 1, backend="gloo", timeout=30) == [[]]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("world_size", [2, 4])
def test_random_floats_agree_and_every_rank_holds_the_same_bits(world_size):
    results = spawn(random_float_worker, world_size, backend="gloo", timeout=30)
    assert all(ok for _, ok in results)
    assert all(values == results[0][0] for values, _ in results)  # bitwise identical on all ranks


@pytest.mark.timeout(60)
def test_small_dtypes_agree_with_dist_or_are_refused_like_it():
    assert spawn(other_dtypes_worker, 3, backend="gloo", timeout=45) == [[]] * 3


@pytest.mark.timeout(60)
@pytest.mark.parametrize("world_size", [2, 3])
def test_complex_sum_avg_equal_dist_and_product_equals_one_process_product(world_size):
    assert spawn(complex_worker, world_size, backend="gloo", timeout=45) == [[]] * world_size


@pytest.mark.timeout(60)
def test_many_small_pieces_and_any_lookahead_depth():
    assert spawn(pipelining_worker, 3, backend="gloo", timeout=45) == [[]] * 3


@pytest.mark.timeout(60)
def test_subgroup_ring_uses_group_ranks_and_skips_non_members():
    results = spawn(subgroup_worker, 4, backend="gloo", timeout=30)
    assert results[0] == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert results[1] == results[2] == results[3] == [60.0 + 3 * i for i in range(5)]


@pytest.mark.timeout(60)
def test_trace_shows_reduce_scatter_then_all_gather():
    states = spawn(ring_trace, 3, backend="gloo", timeout=30)
    assert [len(s) for s in states] == [5, 5, 5]  # start + 2 reduce-scatter + 2 all-gather steps
    assert all(s[-1] == [111.0] * 3 for s in states)
    # after reduce-scatter rank r owns the finished segment r + 1, and only that one
    for rank, s in enumerate(states):
        finished = [j for j, v in enumerate(s[2]) if v == 111.0]
        assert finished == [(rank + 1) % 3]


def test_wrong_op_is_refused_before_any_communication():
    for op in (ReduceOp.BAND, ReduceOp.BXOR, "sum", 0.5):
        with pytest.raises(ValueError, match="SUM, PRODUCT, MIN, MAX and AVG"):
            ring_all_reduce(torch.ones(3, dtype=torch.int64), op)


def test_non_contiguous_tensor_is_refused():
    with pytest.raises(ValueError, match="contiguous"):
        ring_all_reduce(torch.ones(4, 3).t())


def test_not_a_tensor_is_refused():
    with pytest.raises(TypeError, match="torch.Tensor"):
        ring_all_reduce([1.0, 2.0])


def test_min_max_of_complex_numbers_is_refused():
    with pytest.raises(TypeError, match="complex"):
        ring_all_reduce(torch.ones(3, dtype=torch.complex64), ReduceOp.MAX)


@pytest.mark.parametrize("numel,world_size", [(0, 3), (2, 4), (7, 3), (100_003, 4), (8, 2)])
def test_segments_cover_the_tensor_and_differ_by_at_most_one(numel, world_size):
    bounds = segment_bounds(numel, world_size)
    assert len(bounds) == world_size
    assert bounds[0][0] == 0 and bounds[-1][1] == numel
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
    sizes = [stop - start for start, stop in bounds]
    assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)
