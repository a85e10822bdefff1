"""Typical wrong answers to exercise 21.1 (lesson 21), and the words their diagnosis must contain.

Same format as ``exercise_mistakes``: ``(exercise, source, words, timeout in seconds)``.
"""

from __future__ import annotations

from exercise_mistakes import broken

MISTAKES = {
    "dispatch_combine forgets to undo the sort": (
        "dispatch_combine", broken("dispatch_combine", "    out = torch.empty_like(x)\n    out[order] = back", "    out = back"),
        ["world of 2", "came back holding row", "undo the sort"], 30),
    "dispatch_combine sends the results back with the split sizes unswapped": (
        "dispatch_combine", broken("dispatch_combine",
                                   "dist.all_to_all_single(back, done.contiguous(), output_split_sizes=send, input_split_sizes=recv)",
                                   "dist.all_to_all_single(back, done.contiguous(), output_split_sizes=recv, input_split_sizes=send)"),
        ["world of 2", "Split sizes"], 30),
    "dispatch_combine gathers the counts with all_gather": (
        "dispatch_combine", broken("dispatch_combine", "    dist.all_to_all_single(recv_counts, send_counts)  # step 1: who sends me how many\n",
                                   "    everyone = [torch.empty_like(send_counts) for _ in range(n)]\n"
                                   "    dist.all_gather(everyone, send_counts)\n"
                                   "    recv_counts = torch.stack([c[dist.get_rank()] for c in everyone])\n"),
        ["NotAllowed", "all_to_all_single for the counts"], 30),
    "dispatch_combine computes on the rows before sending them": (
        "dispatch_combine", broken("dispatch_combine", "    done = compute(received)", "    done = received")
        .replace("dist.all_to_all_single(received, x[order],", "dist.all_to_all_single(received, compute(x[order]),"),
        ["sent to rank 1", "came back to its place, but computed on rank 0", "after the dispatch"], 30),
}

ALSO_RIGHT = {
    "dispatch_combine with torch.sort and index_copy": (
        "dispatch_combine", """import torch
import torch.distributed as dist


def dispatch_combine(x, destination, compute):
    n = dist.get_world_size()
    _, order = torch.sort(destination, stable=True)
    counts = torch.stack([(destination == r).sum() for r in range(n)])
    incoming = torch.empty_like(counts)
    dist.all_to_all_single(incoming, counts)
    send, recv = counts.tolist(), incoming.tolist()
    rows = x.new_empty((sum(recv), x.shape[1]))
    dist.all_to_all_single(rows, x.index_select(0, order), recv, send)
    results = compute(rows)
    back = torch.empty_like(x)
    dist.all_to_all_single(back, results, send, recv)
    return torch.empty_like(x).index_copy_(0, order, back)
""", 30),
}
