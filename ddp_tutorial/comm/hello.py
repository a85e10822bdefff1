"""The first distributed program: every rank says hello and all-reduces a number.

Used by ``00_start_here`` (through ``launch.spawn``), by the doctor, and by
``make demo`` until the training module exists. From a shell:

    torchrun --nproc-per-node=2 -m ddp_tutorial.comm.hello
    python -m ddp_tutorial.comm.hello          # one process, a world of one
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ddp_tutorial.env import distributed, rank_device


def all_reduce_ranks(rank: int, world_size: int) -> float:
    """Each rank contributes its rank; after ``all_reduce`` every rank holds the sum 0+1+...+(n-1)."""
    x = torch.tensor([float(rank)], device=rank_device())  # the CPU with gloo, this rank's GPU with NCCL
    print(f"hello from rank {rank} of {world_size}, holding {x.item():.0f}")
    dist.all_reduce(x, op=dist.ReduceOp.SUM)
    print(f"after all_reduce rank {rank} holds {x.item():.0f}")
    return x.item()


def main() -> None:
    with distributed() as (info, _device):
        total = all_reduce_ranks(info.rank, info.world_size)
        expected = info.world_size * (info.world_size - 1) / 2
        assert total == expected, f"all_reduce gave {total}, expected {expected}"
        if info.is_main:
            print(f"all_reduce over {info.world_size} rank(s) on {dist.get_backend()}: OK")


if __name__ == "__main__":
    main()
