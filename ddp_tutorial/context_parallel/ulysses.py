"""Ulysses: context parallelism by all-to-all, heads scattered and the sequence gathered (``20_long_sequences``).

Ring attention keeps the heads whole and moves K/V blocks around the ring. DeepSpeed-Ulysses
(Jacobs et al. 2023, arXiv:2309.14509) turns the split around for the attention itself: one
``all_to_all`` takes every rank's ``(batch, heads, seq/N, d)`` q, k and v to ``(batch,
heads/N, seq, d)``, all of the sequence for ``1/N`` of the heads, so each rank runs ordinary
attention (here ``scaled_dot_product_attention``) on whole sequences; a second ``all_to_all``
brings the output back to the sequence shard. Heads are independent, so nothing is merged.

The cost: four all-to-alls per attention forward (q, k, v and the output), each sending
``(N - 1)/N`` of one activation tensor ``A`` away: ``4 (N - 1)/N A`` per rank, against the ring's
``2 (N - 1) A`` (``comm_volume``). Fewer bytes, but the all-to-alls block the attention and reach
every rank of the group, so they stay inside a node in practice; and ``N`` may not exceed the
number of heads (here it must divide them; DeepSpeed allows uneven heads since PR #6392; with
grouped K/V and ``N > kv_heads`` the K/V heads are replicated). The all-to-all is its own
inverse, so its backward is the other all-to-all.

    torchrun --nproc-per-node=2 -m ddp_tutorial.context_parallel.ulysses   # equal to SDPA, causal and not
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist

from ddp_tutorial.context_parallel.ring_attention import (
    compare,
    loss_weight,
    qkv_inputs,
    shard_sequence,
    tolerance,
)
from ddp_tutorial.env import distributed, rank_device
from ddp_tutorial.launch.verdict import verdict

__all__ = ["seq_to_heads", "heads_to_seq", "SeqToHeads", "HeadsToSeq", "ulysses_attention", "ulysses_case",
           "ulysses_worker", "main"]


def seq_to_heads(x: torch.Tensor, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """``(b, h, s/N, d)`` on every rank -> ``(b, h/N, s, d)``: rank ``r`` gets heads ``r`` of all the sequence."""
    n = dist.get_world_size(group)
    b, h, s, d = x.shape
    if h % n:
        raise ValueError(f"{h} heads do not split over {n} ranks: Ulysses needs N <= heads, dividing them")
    outgoing = x.reshape(b, n, h // n, s, d).transpose(0, 1).contiguous()  # part j: heads of rank j
    incoming = torch.empty_like(outgoing)
    dist.all_to_all_single(incoming, outgoing, group=group)  # part i: my heads of rank i's sequence
    return incoming.permute(1, 2, 0, 3, 4).reshape(b, h // n, n * s, d)


def heads_to_seq(x: torch.Tensor, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """The inverse: ``(b, h/N, s, d)`` -> ``(b, h, s/N, d)``, rank ``r`` gets sequence shard ``r`` of every head."""
    n = dist.get_world_size(group)
    b, hn, s, d = x.shape
    outgoing = x.reshape(b, hn, n, s // n, d).permute(2, 0, 1, 3, 4).contiguous()  # part j: rank j's positions
    incoming = torch.empty_like(outgoing)
    dist.all_to_all_single(incoming, outgoing, group=group)  # part i: rank i's heads of my positions
    return incoming.transpose(0, 1).reshape(b, n * hn, s // n, d)


class SeqToHeads(torch.autograd.Function):
    """``seq_to_heads`` in forward, ``heads_to_seq`` of the gradient in backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
        ctx.group = group
        return seq_to_heads(x, group)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return heads_to_seq(grad.contiguous(), ctx.group), None


class HeadsToSeq(torch.autograd.Function):
    """``heads_to_seq`` in forward, ``seq_to_heads`` of the gradient in backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
        ctx.group = group
        return heads_to_seq(x, group)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return seq_to_heads(grad.contiguous(), ctx.group), None


def ulysses_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
                      group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """``ring_attention``'s contract by all-to-all: this rank's contiguous sequence shard
    ``(batch, heads, seq/N, head_dim)`` in and out, equal to SDPA on the whole sequence."""
    q, k, v = (SeqToHeads.apply(t, group) for t in (q, k, v))
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)  # whole sequences
    return HeadsToSeq.apply(out, group)


def ulysses_case(rank: int, world_size: int, shape: tuple[int, int, int, int], *, causal: bool = False,
                 dtype: torch.dtype = torch.float32) -> dict:
    """Ulysses attention of this rank's shard, forward and backward of ``reference_attention``'s loss."""
    device = rank_device()
    full = qkv_inputs(shape, dtype)
    q, k, v = (shard_sequence(t, rank, world_size).to(device).requires_grad_() for t in full)
    out = ulysses_attention(q, k, v, causal=causal)
    (out * shard_sequence(loss_weight(shape, dtype), rank, world_size).to(device)).sum().backward()
    return {"rank": rank, "out": out.detach().cpu(), "dq": q.grad.cpu(), "dk": k.grad.cpu(), "dv": v.grad.cpu()}


def ulysses_worker(rank: int, world_size: int, shape: tuple[int, int, int, int] = (2, 4, 16, 8)) -> list[dict]:
    """``ulysses_case`` without and with the causal mask, in one launch."""
    return [ulysses_case(rank, world_size, shape, causal=causal) for causal in (False, True)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq", type=int, default=16, help="sequence length, a multiple of the world size")
    parser.add_argument("--heads", type=int, default=4, help="heads, a multiple of the world size")
    args = parser.parse_args()
    shape = (2, args.heads, args.seq, 8)
    with distributed() as (info, _):
        for causal in (False, True):
            result = ulysses_case(info.rank, info.world_size, shape, causal=causal)
            results = [None] * info.world_size
            dist.all_gather_object(results, result)
            if info.is_main:
                diff = compare(results, qkv_inputs(shape, torch.float32), causal=causal)
                ok = max(diff.values()) < tolerance(torch.float32)
                verdict(ok, f"Ulysses over {info.world_size} rank(s), causal={causal}: output "
                            "and q/k/v gradients equal SDPA on the whole sequence")


if __name__ == "__main__":
    main()
