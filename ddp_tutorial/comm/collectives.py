"""The collectives, one worker each: what every rank holds before and after.

Used by ``05_collectives`` (pictures drawn from what these workers return) and by
``tests/comm/test_collectives.py``. Every worker returns ``(before, after)``: the
values this rank holds, as lists, or ``None`` where the rank holds nothing
(or nothing it may read). The flat forms that FSDP and ZeRO use are here too
(``all_gather_flat``, ``reduce_scatter_flat``); object collectives are in
``object_collectives``. From a shell:

    torchrun --nproc-per-node=2 -m ddp_tutorial.comm.collectives
    python -m ddp_tutorial.comm.collectives          # a world of one: every collective is a copy
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed import ReduceOp

from ddp_tutorial.comm.ring import segment_bounds
from ddp_tutorial.env import distributed, rank_device

__all__ = ["COLLECTIVES", "Holding", "rank_data", "broadcast", "scatter", "gather",
           "reduce", "all_reduce", "all_gather", "reduce_scatter", "all_to_all", "all_gather_uneven",
           "ragged_all_gather", "run_all", "all_gather_flat", "reduce_scatter_flat", "flat_and_list",
           "every_reduce_op", "async_all_reduce"]

# (before, after): what a rank holds, ``None`` where it holds nothing it may read
Holding = tuple[list | None, list | None]


def rank_data(rank: int, numel: int, dtype: torch.dtype = torch.float32,
              on: torch.device | None = None) -> torch.Tensor:
    """Rank r's input ``10r+1, 10r+2, ...``: whole numbers, exact in any dtype; tens digit = rank."""
    return (torch.arange(1, numel + 1) + 10 * rank).to(dtype=dtype, device=on)


def _listed(x: torch.Tensor | None) -> list | None:
    return None if x is None else x.tolist()


def broadcast(rank: int, world_size: int, numel: int = 2, dtype: torch.dtype = torch.float32,
              src: int = 0) -> Holding:
    """Rank ``src``'s tensor is copied to every rank (DDP does this to the initial weights)."""
    x = rank_data(rank, numel, dtype, rank_device())
    before = x.tolist()
    dist.broadcast(x, src=src)
    return before, x.tolist()


def scatter(rank: int, world_size: int, numel: int = 2, dtype: torch.dtype = torch.float32,
            src: int = 0) -> Holding:
    """Rank ``src`` cuts its data into ``world_size`` chunks; rank i receives chunk i."""
    chunks = None
    if rank == src:
        chunks = list(rank_data(rank, numel * world_size, dtype, rank_device()).chunk(world_size))
    out = torch.zeros(numel, dtype=dtype, device=rank_device())
    dist.scatter(out, chunks, src=src)
    return _listed(torch.cat(chunks) if chunks else None), out.tolist()


def gather(rank: int, world_size: int, numel: int = 2, dtype: torch.dtype = torch.float32,
           dst: int = 0) -> Holding:
    """Every rank's tensor lands, in rank order, on rank ``dst`` only."""
    x = rank_data(rank, numel, dtype, rank_device())
    bucket = [torch.empty_like(x) for _ in range(world_size)] if rank == dst else None
    dist.gather(x, bucket, dst=dst)
    return x.tolist(), _listed(torch.cat(bucket) if bucket else None)


def reduce(rank: int, world_size: int, numel: int = 2, dtype: torch.dtype = torch.float32, dst: int = 0,
           op: ReduceOp = ReduceOp.SUM) -> Holding:
    """The element-wise ``op`` of all tensors, on rank ``dst`` only (the others' tensors are scratch)."""
    x = rank_data(rank, numel, dtype, rank_device())
    before = x.tolist()
    dist.reduce(x, dst=dst, op=op)
    return before, x.tolist() if rank == dst else None


def all_reduce(rank: int, world_size: int, numel: int = 2, dtype: torch.dtype = torch.float32,
               op: ReduceOp = ReduceOp.SUM) -> Holding:
    """The element-wise ``op`` of all tensors, on every rank (DDP's gradient averaging)."""
    x = rank_data(rank, numel, dtype, rank_device())
    before = x.tolist()
    dist.all_reduce(x, op=op)
    return before, x.tolist()


def all_gather(rank: int, world_size: int, numel: int = 2, dtype: torch.dtype = torch.float32) -> Holding:
    """Every rank ends with every rank's tensor, in rank order (ZeRO-3/FSDP rebuild weights so)."""
    x = rank_data(rank, numel, dtype, rank_device())
    out = [torch.empty_like(x) for _ in range(world_size)]
    dist.all_gather(out, x)
    return x.tolist(), torch.cat(out).tolist()


def reduce_scatter(rank: int, world_size: int, numel: int = 2, dtype: torch.dtype = torch.float32,
                   op: ReduceOp = ReduceOp.SUM) -> Holding:
    """Reduce, but rank i keeps only part i of the result (ZeRO's gradient step). Parts may be uneven."""
    x = rank_data(rank, numel, dtype, rank_device())
    parts = [x[a:b] for a, b in segment_bounds(numel, world_size)]
    out = torch.empty_like(parts[rank])
    dist.reduce_scatter(out, parts, op=op)
    return x.tolist(), out.tolist()


def all_to_all(rank: int, world_size: int, numel: int = 2, dtype: torch.dtype = torch.float32) -> Holding:
    """Part j of rank i's tensor goes to rank j: a transpose across ranks (MoE token routing)."""
    x = rank_data(rank, numel, dtype, rank_device())
    sizes = [b - a for a, b in segment_bounds(numel, world_size)]
    out = torch.empty(sizes[rank] * world_size, dtype=dtype, device=x.device)
    # The _single form takes split sizes, even or not, on every backend and release. The list
    # form, dist.all_to_all, takes uneven parts on NCCL; gloo refuses them (newer releases want
    # every tensor the shape of the first: "invalid tensor size"; 2.9-2.10 have no list form at all).
    dist.all_to_all_single(out, x, output_split_sizes=[sizes[rank]] * world_size,
                           input_split_sizes=sizes)
    return x.tolist(), out.tolist()


COLLECTIVES = {f.__name__: f for f in (broadcast, scatter, gather, reduce, all_reduce, all_gather,
                                       reduce_scatter, all_to_all)}


def all_gather_uneven(tensor: torch.Tensor, group: dist.ProcessGroup | None = None) -> list[torch.Tensor]:
    """``all_gather`` for 1-D tensors of different lengths: share lengths, pad to the longest, trim."""
    world_size = dist.get_world_size(group)
    length = torch.tensor([tensor.numel()], device=tensor.device)
    lengths = [torch.zeros_like(length) for _ in range(world_size)]
    dist.all_gather(lengths, length, group=group)
    longest = int(max(lengths).item())
    padded = torch.zeros(longest, dtype=tensor.dtype, device=tensor.device)
    padded[:tensor.numel()] = tensor
    out = [torch.empty_like(padded) for _ in range(world_size)]
    dist.all_gather(out, padded, group=group)
    return [t[:int(n.item())] for t, n in zip(out, lengths)]


def ragged_all_gather(rank: int, world_size: int, dtype: torch.dtype = torch.float32) -> Holding:
    """Rank r holds r + 1 values; everyone ends with all of them (a worker for ``all_gather_uneven``)."""
    x = rank_data(rank, rank + 1, dtype, rank_device())
    return x.tolist(), torch.cat(all_gather_uneven(x)).tolist()


def run_all(rank: int, world_size: int, numel: int = 2, dtype: torch.dtype = torch.float32) -> dict:
    """Every collective in turn (one launch for the notebook's pictures): name -> (before, after)."""
    return {name: fn(rank, world_size, numel, dtype) for name, fn in COLLECTIVES.items()}


# The flat forms' names: torch 2.13 renamed all_gather_into_tensor to all_gather_single and
# reduce_scatter_tensor to reduce_scatter_single (the old names still work, with a
# FutureWarning); older releases have only the old names. Use whichever this torch has.
all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def all_gather_flat(rank: int, world_size: int, numel: int = 2, dtype: torch.dtype = torch.float32) -> Holding:
    """``all_gather_into_tensor``: every rank's tensor into ONE flat output, rank r's at [r*numel, (r+1)*numel)."""
    x = rank_data(rank, numel, dtype, rank_device())
    out = torch.empty(world_size * numel, dtype=dtype, device=x.device)  # no list, no torch.cat
    all_gather_single(out, x)  # every rank must send the same numel
    return x.tolist(), out.tolist()


def reduce_scatter_flat(rank: int, world_size: int, numel: int = 2, dtype: torch.dtype = torch.float32,
                        op: ReduceOp = ReduceOp.SUM) -> Holding:
    """``reduce_scatter_tensor``: ONE flat input of ``world_size * numel``; rank r keeps reduced part r."""
    x = rank_data(rank, world_size * numel, dtype, rank_device())
    out = torch.empty(numel, dtype=dtype, device=x.device)  # the parts are equal: numel each
    reduce_scatter_single(out, x, op=op)
    return x.tolist(), out.tolist()


def flat_and_list(rank: int, world_size: int, numel: int = 2, dtype: torch.dtype = torch.float32) -> dict:
    """The flat forms next to the list forms, on the same inputs: name -> (before, after)."""
    return {"all_gather": all_gather(rank, world_size, numel, dtype),
            "all_gather_flat": all_gather_flat(rank, world_size, numel, dtype),
            "reduce_scatter": reduce_scatter(rank, world_size, world_size * numel, dtype),
            "reduce_scatter_flat": reduce_scatter_flat(rank, world_size, numel, dtype)}


def every_reduce_op(rank: int, world_size: int) -> dict[str, str]:
    """``all_reduce`` with every ``ReduceOp``: the result, or why this backend refuses it.

    Arithmetic ops get floats ``[r + 1, 6 - r]``; the bitwise ones get the same as integers.
    (``PREMUL_SUM`` is not a plain op: NCCL builds it with a factor, ``_make_nccl_premul_sum``.)
    """
    results = {}
    for name in ("SUM", "PRODUCT", "MIN", "MAX", "AVG", "BAND", "BOR", "BXOR"):
        dtype = torch.int64 if name.startswith("B") else torch.float32
        x = torch.tensor([rank + 1, 6 - rank], dtype=dtype, device=rank_device())
        try:
            dist.all_reduce(x, op=getattr(ReduceOp, name))
            results[name] = str(x.tolist())
        except (RuntimeError, TypeError, ValueError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            results[name] = f"refused ({type(exc).__name__}: {first[:60]})"
    return results


def async_all_reduce(rank: int, world_size: int, numel: int = 1 << 16) -> dict:
    """``async_op=True`` returns a work handle at once; compute meanwhile, ``wait()`` before reading."""
    x = torch.full((numel,), float(rank + 1), device=rank_device())
    work = dist.all_reduce(x, async_op=True)
    local = float((torch.arange(100.0) ** 2).sum())  # work that does not touch x overlaps the transfer
    work.wait()  # only now may x be read (or written)
    y = torch.full((4,), float(rank + 1), device=x.device)
    # a future can chain a step after the collective: here turning the sum into a mean
    mean = dist.all_reduce(y, async_op=True).get_future().then(lambda f: f.value()[0] / world_size)
    return {"handle": type(work).__name__, "completed after wait": work.is_completed(),
            "x[0]": x[0].item(), "local result": local, "mean via future": mean.wait().tolist()}


def main() -> None:
    with distributed() as (info, _device):
        for name, fn in COLLECTIVES.items():
            before, after = fn(info.rank, info.world_size)
            print(f"rank {info.rank} {name:>14}: {before} -> {after}")
        dist.barrier()
        if info.is_main:
            print(f"{len(COLLECTIVES)} collectives on {info.world_size} rank(s), "
                  f"{dist.get_backend()}: OK")


if __name__ == "__main__":
    main()
