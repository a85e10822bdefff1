"""Ring all-reduce from scratch: reduce-scatter, then all-gather, over point-to-point ops.

Used by ``06_ring_all_reduce`` (and measured by ``python -m ddp_tutorial.bench allreduce``).
From a shell:

    torchrun --nproc-per-node=2 -m ddp_tutorial.comm.ring
    python -m ddp_tutorial.comm.ring          # one process: a world of one, nothing to exchange

The tensor is cut into ``world_size`` segments. In ``world_size - 1`` reduce-scatter
steps every rank sends one segment to its right neighbour and folds the segment
coming from its left neighbour into its own copy; afterwards rank ``r`` owns the
finished segment ``r + 1``. In ``world_size - 1`` all-gather steps the finished
segments travel once more around the ring. Each rank sends and receives
``2 (n - 1) / n`` times the tensor size, whatever ``n`` is: that is why a ring's
bandwidth cost does not grow with the number of ranks.

Segments are cut into pieces (``PIECE_BYTES``) that are forwarded as soon as they
are reduced, with ``DEPTH`` receives posted ahead of the piece being reduced (all
of the all-gather's at once), so the network and the reduction overlap.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from torch.distributed import ReduceOp

from ddp_tutorial.env import distributed, rank_device

__all__ = ["ring_all_reduce", "ring_all_reduce_flat", "ring_jobs", "Receives", "pieces", "segment_bounds",
           "ring_trace", "compare_with_dist", "SUPPORTED_OPS", "PIECE_BYTES", "DEPTH"]

SUPPORTED_OPS = (ReduceOp.SUM, ReduceOp.PRODUCT, ReduceOp.MIN, ReduceOp.MAX, ReduceOp.AVG)
# Big enough that per-message overhead is small, small enough to pipeline a 16 MB tensor.
PIECE_BYTES = 2 << 20
# Receives posted ahead of the piece being reduced, so the network never waits for us.
DEPTH = 1


def segment_bounds(numel: int, world_size: int) -> list[tuple[int, int]]:
    """``(start, stop)`` of each rank's segment; the first ``numel % world_size`` get one element more."""
    base, extra = divmod(numel, world_size)
    bounds, start = [], 0
    for i in range(world_size):
        stop = start + base + (1 if i < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


def _combine(op) -> Callable[[torch.Tensor, torch.Tensor], object]:
    """In-place ``acc = acc (op) incoming``; AVG sums here and divides once at the end."""
    if op in (ReduceOp.SUM, ReduceOp.AVG):
        return lambda acc, x: acc.add_(x)
    if op == ReduceOp.PRODUCT:
        return lambda acc, x: acc.mul_(x)
    if op == ReduceOp.MIN:
        return lambda acc, x: torch.minimum(acc, x, out=acc)
    return lambda acc, x: torch.maximum(acc, x, out=acc)


def _check(tensor: torch.Tensor, op) -> None:
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"ring_all_reduce needs a torch.Tensor, got {type(tensor).__name__}")
    try:
        supported = op in SUPPORTED_OPS
    except TypeError:  # unhashable or uncomparable
        supported = False
    if not supported:
        name = getattr(op, "name", repr(op))
        raise ValueError(f"ring_all_reduce supports ReduceOp.SUM, PRODUCT, MIN, MAX and AVG; got {name}")
    if not tensor.is_contiguous():
        raise ValueError("ring_all_reduce works in place on a contiguous tensor; this one is not "
                         f"(shape {tuple(tensor.shape)}, stride {tensor.stride()}): reduce "
                         "t.contiguous() and copy the result back")
    if op == ReduceOp.AVG and not (tensor.is_floating_point() or tensor.is_complex()):
        raise TypeError(f"ReduceOp.AVG needs a floating-point or complex tensor, got {tensor.dtype} "
                        "(as dist.all_reduce on gloo); use SUM and divide yourself")
    if op in (ReduceOp.MIN, ReduceOp.MAX) and tensor.is_complex():
        raise TypeError(f"ReduceOp.{op.name} has no meaning for complex numbers ({tensor.dtype})")


def ring_all_reduce(tensor: torch.Tensor, op: ReduceOp = ReduceOp.SUM,
                    group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """All-reduce ``tensor`` in place (same result as ``dist.all_reduce``) and return it.

    Chunked reduce-scatter then all-gather over ``isend``/``irecv`` around the ring
    of ``group`` (default: the whole world). Any numel (also 0 or fewer elements
    than ranks), any dtype, ops SUM, PRODUCT, MIN, MAX and AVG (``06_ring_all_reduce``).
    """
    _check(tensor, op)
    ring_all_reduce_flat(tensor.view(-1), op, group)
    return tensor


def ring_all_reduce_flat(flat: torch.Tensor, op: ReduceOp, group: dist.ProcessGroup | None, *,
                         piece_bytes: int = PIECE_BYTES, depth: int = DEPTH,
                         snapshot: Callable[[int], None] | None = None) -> None:
    """The algorithm, in place on a 1-D contiguous tensor, without ``ring_all_reduce``'s checks.

    ``piece_bytes`` and ``depth`` tune the pipelining (the benchmark and the tests vary
    them); ``snapshot(step)`` (teaching only) is called after each step, in lock-step.
    """
    rank = dist.get_rank(group)
    if rank < 0:  # not a member of ``group``: like dist.all_reduce, nothing to do
        return
    n = dist.get_world_size(group)
    if n == 1 or flat.numel() == 0:
        return
    # p2p ops take global ranks, even inside a subgroup
    to_global = (lambda r: r) if group is None else (lambda r: dist.get_global_rank(group, r))
    right, left = to_global((rank + 1) % n), to_global((rank - 1) % n)
    bounds = segment_bounds(flat.numel(), n)
    piece = max(1, piece_bytes // flat.element_size())
    jobs, reducing = ring_jobs(rank, n, bounds, piece)
    combine = _combine(op)
    if snapshot is not None:
        depth = 0  # a snapshot must not see the next step's data arriving early
    receives = Receives(flat, jobs, reducing, left=left, group=group, depth=depth, piece=min(piece, bounds[0][1]),
                        gather_at_once=snapshot is None)
    sends = [dist.isend(flat[a:b], dst=right, group=group) for a, b in pieces(bounds[rank], piece)]
    for i, (t, a, b) in enumerate(jobs):
        into = receives.take(i)
        if i < reducing:
            combine(flat[a:b], into)
            if t == n - 2 and op == ReduceOp.AVG:
                # the owner finishes the mean before it is shared (complex: divide the
                # real and imaginary parts, as gloo does, not by complex division)
                (torch.view_as_real(flat[a:b]) if flat.is_complex() else flat[a:b]).div_(n)
        if t < 2 * n - 3:  # forward at once: this piece is what the right neighbour needs next
            sends.append(dist.isend(flat[a:b], dst=right, group=group))
        if snapshot is not None and (i + 1 == len(jobs) or jobs[i + 1][0] != t):
            snapshot(t)
    for work in sends:
        work.wait()


def pieces(segment: tuple[int, int], piece: int) -> list[tuple[int, int]]:
    """A segment ``(start, stop)`` cut into pieces of at most ``piece`` elements."""
    start, stop = segment
    return [(a, min(a + piece, stop)) for a in range(start, stop, piece)]


def ring_jobs(rank: int, world_size: int, bounds: list[tuple[int, int]],
              piece: int) -> tuple[list[tuple[int, int, int]], int]:
    """What ``rank`` receives, in order, as ``(step, start, stop)`` pieces, and how many are reduced.

    Step t receives one segment from the left: the first n - 1 steps (reduce-scatter) fold it
    into ours, the last n - 1 (all-gather) keep it. Every piece is a job.
    """
    n = world_size
    jobs = [(t, a, b) for t in range(n - 1) for a, b in pieces(bounds[(rank - t - 1) % n], piece)]
    reducing = len(jobs)
    jobs += [(t, a, b) for t in range(n - 1, 2 * n - 2) for a, b in pieces(bounds[(rank - t + n - 1) % n], piece)]
    return jobs, reducing


class Receives:
    """The receives from the left neighbour, posted ``depth`` jobs ahead of the one being reduced.

    Reduce-scatter pieces land in ``depth + 1`` small scratch slots (not a whole segment:
    fresh memory costs page faults); all-gather pieces go straight to their place, so with
    ``gather_at_once`` they are all posted as soon as the all-gather is reached (still in
    order: peers match receives to sends in posting order, and NCCL ignores tags).
    """

    def __init__(self, flat: torch.Tensor, jobs: list[tuple[int, int, int]], reducing: int, *, left: int,
                 group: dist.ProcessGroup | None, depth: int, piece: int, gather_at_once: bool):
        self.flat, self.jobs, self.reducing, self.left, self.group = flat, jobs, reducing, left, group
        self.depth, self.gather_at_once = depth, gather_at_once
        self.slots = [torch.empty(piece, dtype=flat.dtype, device=flat.device) for _ in range(depth + 1)]
        self.posted: list[tuple[torch.Tensor, dist.Work]] = []
        self.next_post = 0

    def take(self, i: int) -> torch.Tensor:
        """Job ``i``'s received piece, once it has arrived (posting the ones ahead of it first)."""
        self._post_ahead(i)
        into, work = self.posted.pop(0)
        work.wait()
        return into

    def _post_ahead(self, i: int) -> None:
        while self.next_post < len(self.jobs) and (
                self.next_post <= i + self.depth or (self.gather_at_once and self.next_post >= self.reducing)):
            _, a, b = self.jobs[self.next_post]
            slot = self.slots[self.next_post % len(self.slots)]
            into = slot[:b - a] if self.next_post < self.reducing else self.flat[a:b]
            self.posted.append((into, dist.irecv(into, src=self.left, group=self.group)))
            self.next_post += 1


def ring_trace(rank: int, world_size: int, numel: int | None = None) -> list[list[float]]:
    """What this rank's tensor holds before and after each ring step (``06_ring_all_reduce``'s picture).

    Rank ``r`` starts with ``10**r`` everywhere, so each digit of a (partial) sum
    tells which ranks have been added in: 1011 = ranks 0, 1 and 3.
    """
    numel = world_size if numel is None else numel
    x = torch.full((numel,), float(10 ** rank), dtype=torch.float64, device=rank_device())
    states = [x.tolist()]
    ring_all_reduce_flat(x, ReduceOp.SUM, None, snapshot=lambda step: states.append(x.tolist()))
    expected = float(sum(10 ** r for r in range(world_size)))
    assert x.eq(expected).all(), f"rank {rank}: {x.tolist()} != {expected}"
    return states


def compare_with_dist(rank: int, world_size: int, numel: int = 5,
                      dtype: torch.dtype = torch.float64) -> dict[str, tuple[list, bool]]:
    """Each op on one input through ``ring_all_reduce`` and ``dist.all_reduce``: (ring result, equal?)."""
    on = rank_device()
    out = {}
    for op in SUPPORTED_OPS:
        if op == ReduceOp.AVG and not dtype.is_floating_point:
            continue
        x = (torch.arange(numel, device=on) % 3 + rank + 1).to(dtype)
        expected = x.clone()
        dist.all_reduce(expected, op)
        ring_all_reduce(x, op)
        # NCCL's AVG multiplies each input by 1/n before adding: exact only when n is a
        # power of two. gloo (and our ring) add first, then divide.
        exact = op != ReduceOp.AVG or dist.get_backend() != "nccl" or world_size & (world_size - 1) == 0
        same = torch.equal(x, expected) if exact else torch.allclose(x, expected, rtol=1e-12, atol=0.0)
        out[op.name] = (x.tolist(), same)
    return out


def main() -> None:
    with distributed() as (info, device):
        for op in SUPPORTED_OPS:
            x = torch.arange(1, 8, dtype=torch.float64, device=device) + info.rank
            expected = x.clone()
            ring_all_reduce(x, op)
            dist.all_reduce(expected, op)
            assert torch.allclose(x, expected), f"{op.name}: ring {x.tolist()} != {expected.tolist()}"
        if info.is_main:
            print(f"ring_all_reduce equals dist.all_reduce for SUM, PRODUCT, MIN, MAX, AVG "
                  f"on {info.world_size} rank(s): OK")


if __name__ == "__main__":
    main()
