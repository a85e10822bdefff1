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

``ddp_tutorial.expert_parallel.dispatch`` does the same for a mixture-of-experts layer, with a
gradient (``AllToAll``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist


def dispatch_combine(x: torch.Tensor, destination: torch.Tensor,
                     compute: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """Send row ``x[i]`` to rank ``destination[i]``, apply ``compute`` there, return the results in place of the rows.

    ``x`` (rows, features) and ``destination`` (rows,), int64 rank numbers, are this rank's; a
    rank may send no row at all, or all of them to one rank. Every rank calls
    ``compute(received)`` once, on all the rows that arrived (rows, features) in any order; it
    works row by row and returns a tensor of the same shape. Return ``out``, shaped like ``x``,
    where ``out[i]`` is what ``compute`` on rank ``destination[i]`` made of ``x[i]``. Use
    ``dist.all_to_all_single`` only: one for the counts, one to send the rows, one to bring
    the results back.
    """
    n = dist.get_world_size()
    order = torch.argsort(destination, stable=True)  # by destination rank: the parts of the send buffer
    send_counts = torch.bincount(destination, minlength=n)
    recv_counts = torch.empty_like(send_counts)
    dist.all_to_all_single(recv_counts, send_counts)  # step 1: who sends me how many
    send, recv = send_counts.tolist(), recv_counts.tolist()
    received = x.new_empty((sum(recv), *x.shape[1:]))
    dist.all_to_all_single(received, x[order], output_split_sizes=recv, input_split_sizes=send)
    done = compute(received)
    back = torch.empty_like(x)
    dist.all_to_all_single(back, done.contiguous(), output_split_sizes=send, input_split_sizes=recv)
    out = torch.empty_like(x)
    out[order] = back  # back is in sorted order: undo the sort
    return out
