"""Typical wrong answers to exercise 21.1 (lesson 21), and the words their diagnosis must contain.

Same format as ``exercise_mistakes``: ``(exercise, source, words, timeout in seconds)``;
``ALSO_RIGHT`` holds other right answers, which must pass.
"""

from __future__ import annotations

from exercise_mistakes import broken

NAME = "dispatch_combine"
ROWS = "    received = Exchange.apply(x[order], send, recv)  # step 2: uneven parts\n"
BACK = "    back = Exchange.apply(compute(received), recv, send)  # step 3: the sizes swapped\n"
PLAIN = '''import torch
import torch.distributed as dist


def dispatch_combine(x, destination, compute):
    n = dist.get_world_size()
    order = torch.argsort(destination, stable=True)
    send_counts = torch.bincount(destination, minlength=n)
    recv_counts = torch.empty_like(send_counts)
    dist.all_to_all_single(recv_counts, send_counts)
    send, recv = send_counts.tolist(), recv_counts.tolist()
'''

MISTAKES = {
    "dispatch_combine forgets to undo the sort": (
        NAME, broken(NAME, "    return back[torch.argsort(order)]", "    return back"),
        ["world of 2", "came back holding row", "undo the sort"], 30),
    "dispatch_combine sends the results back with the split sizes unswapped": (
        NAME, broken(NAME, BACK, "    back = Exchange.apply(compute(received), send, recv)\n"),
        ["world of 2", "Split sizes"], 30),
    "dispatch_combine gathers the counts with all_gather": (
        NAME, broken(NAME, "    dist.all_to_all_single(recv_counts, send_counts)  # step 1: who sends me how many\n",
                     "    everyone = [torch.empty_like(send_counts) for _ in range(n)]\n"
                     "    dist.all_gather(everyone, send_counts)\n"
                     "    recv_counts = torch.stack([c[dist.get_rank()] for c in everyone])\n"),
        ["NotAllowed", "all_to_all_single for the counts"], 30),
    "dispatch_combine computes on the rows before sending them": (
        NAME, broken(NAME, ROWS + BACK, "    received = Exchange.apply(compute(x[order]), send, recv)\n"
                                        "    back = Exchange.apply(received, recv, send)\n"),
        ["sent to rank 1", "came back to its place, but computed on rank 0", "after the dispatch"], 30),
    "dispatch_combine with plain all-to-alls: right numbers, no backward": (
        NAME, PLAIN + '''    received = x.new_empty((sum(recv), x.shape[1]))
    dist.all_to_all_single(received, x[order], output_split_sizes=recv, input_split_sizes=send)
    back = torch.empty_like(x)
    dist.all_to_all_single(back, compute(received), output_split_sizes=send, input_split_sizes=recv)
    out = torch.empty_like(x)
    out[order] = back
    return out
''', ["world of 1", "no gradient path back to x", "autograd.Function"], 30),
    "dispatch_combine sends every row to every rank: an all-gather in disguise": (
        NAME, '''import torch
import torch.distributed as dist
from torch.distributed.nn.functional import all_to_all_single


def dispatch_combine(x, destination, compute):
    n, rows = dist.get_world_size(), len(x)
    counts = torch.full((n,), rows)
    recv_counts = torch.empty_like(counts)
    dist.all_to_all_single(recv_counts, counts)
    send, recv = [rows] * n, recv_counts.tolist()
    everything = all_to_all_single(x.new_empty((sum(recv), x.shape[1])), x.repeat(n, 1), recv, send)
    done = compute(everything)  # every rank computes every row; each source keeps its destination's
    back = all_to_all_single(x.new_empty((n * rows, x.shape[1])), done, send, recv)
    return back.view(n, rows, x.shape[1])[destination, torch.arange(rows)]
''', ["world of 2", "all-gather in disguise", "n times the traffic", "routing sends it"], 30),
    "dispatch_combine's backward skips the exchange where there is no gradient to send": (
        NAME, broken(NAME, "        return Exchange.apply(grad, ctx.recv, ctx.send), None, None",
                     "        if grad.numel() == 0:  # nothing to send back from here\n"
                     "            return grad.new_zeros((sum(ctx.send), *grad.shape[1:])), None, None\n"
                     "        return Exchange.apply(grad, ctx.recv, ctx.send), None, None"),
        ["still running after 10 s in a world of 2", "also one that sent or received no row"], 10),
    "dispatch_combine sizes its receive buffer by its own rows": (
        NAME, broken(NAME, "    send, recv = send_counts.tolist(), recv_counts.tolist()",
                     "    send, recv = send_counts.tolist(), [len(x) // n] * n  # as many as I send, I thought"),
        ["world of 2", "raised RuntimeError", "output_split_sizes=recv"], 30),
}

ALSO_RIGHT = {
    "dispatch_combine with torch's differentiable all_to_all_single, torch.sort and index_copy": (
        NAME, """import torch
import torch.distributed as dist
from torch.distributed.nn.functional import all_to_all_single


def dispatch_combine(x, destination, compute):
    n = dist.get_world_size()
    _, order = torch.sort(destination, stable=True)
    counts = torch.stack([(destination == r).sum() for r in range(n)])
    incoming = torch.empty_like(counts)
    dist.all_to_all_single(incoming, counts)
    send, recv = counts.tolist(), incoming.tolist()
    rows = all_to_all_single(x.new_empty((sum(recv), x.shape[1])), x.index_select(0, order), recv, send)
    back = all_to_all_single(torch.empty_like(x), compute(rows), send, recv)
    return torch.zeros_like(x).index_copy(0, order, back)
""", 30),
}
