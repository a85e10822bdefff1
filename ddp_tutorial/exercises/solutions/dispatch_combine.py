"""Exercise 21.1, reference solution: send rows to the ranks they are routed to, and bring the results home.

Expert parallelism moves each token to the rank of its expert and back. How many rows go
from each rank to each other one is known only at run time, so the exchange has three steps,
each an ``all_to_all_single``:

1. **counts**: ``send_counts[d]``, the rows for rank ``d``, out; ``recv_counts[s]``, the rows
   that will arrive from rank ``s``, in (equal parts: one count per rank, as in lesson 05);
2. **dispatch**: the rows sorted by destination (a stable sort keeps their order within one
   destination) go out with ``input_split_sizes=send_counts`` and arrive cut by ``recv_counts``;
3. **combine**: after ``compute``, the results go back with the two lists swapped, and land in
   the sorted order: ``out[order] = back`` puts each in its own row again.

Steps 2 and 3 carry a gradient: ``Exchange`` is an autograd function whose backward is the same
all-to-all with the split sizes swapped. Every rank runs both backwards, also one that sent or
received no row: its peers wait in them. ``ddp_tutorial.expert_parallel.dispatch`` does the same
for a mixture-of-experts layer (``AllToAll``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist


class Exchange(torch.autograd.Function):
    """``dist.all_to_all_single`` by split sizes; backward sends the gradients back, the sizes swapped."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, send: list[int], recv: list[int]) -> torch.Tensor:
        ctx.send, ctx.recv = send, recv
        out = x.new_empty((sum(recv), *x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), output_split_sizes=recv, input_split_sizes=send)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return Exchange.apply(grad, ctx.recv, ctx.send), None, None


def dispatch_combine(x: torch.Tensor, destination: torch.Tensor,
                     compute: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """Send row ``x[i]`` to rank ``destination[i]``, apply ``compute`` there, return the results in place of the rows.

    ``x`` (rows, features) and ``destination`` (rows,), int64 rank numbers, are this rank's; a
    rank may send no row at all, or all of them to one rank. Every rank calls
    ``compute(received)`` once, on all the rows that arrived (rows, features) in any order; it
    works row by row and returns a tensor of the same shape. Return ``out``, shaped like ``x``,
    where ``out[i]`` is what ``compute`` on rank ``destination[i]`` made of ``x[i]``, with a
    gradient: backward through ``out`` brings each row's gradient home to ``x`` (and to what
    ``compute`` used), on every rank. Use ``dist.all_to_all_single`` only: one for the counts,
    one to send the rows, one to bring the results back; in backward, the last two reversed.
    """
    n = dist.get_world_size()
    order = torch.argsort(destination, stable=True)  # by destination rank: the parts of the send buffer
    send_counts = torch.bincount(destination, minlength=n)
    recv_counts = torch.empty_like(send_counts)
    dist.all_to_all_single(recv_counts, send_counts)  # step 1: who sends me how many
    send, recv = send_counts.tolist(), recv_counts.tolist()
    received = Exchange.apply(x[order], send, recv)  # step 2: uneven parts
    back = Exchange.apply(compute(received), recv, send)  # step 3: the sizes swapped
    return back[torch.argsort(order)]  # back is in sorted order: undo the sort
