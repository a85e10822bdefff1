"""Typical wrong answers to exercises 21.1 and 21.2 (lesson 21), and the words their diagnosis must contain.

Same format as ``exercise_mistakes``: ``(exercise, source, words, timeout in seconds)``;
``ALSO_RIGHT`` holds other right answers, which must pass.
"""

from __future__ import annotations

from exercise_mistakes import broken

NAME = "dispatch_combine"
CAPACITY = "capacity_dispatch"
KEEP = "    keep = before < limit\n"
LIMIT = "    limit = math.ceil(capacity_factor * tokens * k / num_experts)\n"
OUT = "    return torch.zeros_like(x).index_add_(0, token, back)\n"
# Every row of every rank to every rank; each rank keeps, per source, the kept rows of its own experts
EVERY_ROW_EVERYWHERE = '''import math

import torch
import torch.distributed as dist


def kept_in_token_order(chosen, limit):
    taken, kept = {}, []
    for t in range(len(chosen)):
        for e in chosen[t].tolist():
            taken[e] = taken.get(e, 0) + 1
            if taken[e] <= limit:
                kept.append((t, e))
    return kept


def capacity_dispatch(x, chosen, compute, *, num_experts, capacity_factor):
    rank, n = dist.get_rank(), dist.get_world_size()
    per, (tokens, k) = num_experts // n, chosen.shape
    incoming = torch.empty(n, dtype=torch.long)
    dist.all_to_all_single(incoming, torch.full((n,), tokens))
    recv = incoming.tolist()
    everything = x.new_empty((sum(recv), x.shape[1]))
    dist.all_to_all_single(everything, x.repeat(n, 1), output_split_sizes=recv, input_split_sizes=[tokens] * n)
    choices = chosen.new_empty((sum(recv), k))
    dist.all_to_all_single(choices, chosen.repeat(n, 1), output_split_sizes=recv, input_split_sizes=[tokens] * n)
    rows, experts, sizes = [], [], []
    for part_x, part_c in zip(everything.split(recv), choices.split(recv)):
        limit = math.ceil(capacity_factor * len(part_c) * k / num_experts)
        mine = [(t, e) for t, e in kept_in_token_order(part_c, limit) if e // per == rank]
        rows += [part_x[t] for t, _ in mine]
        experts += [e for _, e in mine]
        sizes.append(len(mine))
    done = compute(torch.stack(rows) if rows else x.new_empty((0, x.shape[1])), torch.tensor(experts, dtype=torch.long))
    kept = kept_in_token_order(chosen, math.ceil(capacity_factor * tokens * k / num_experts))
    back_sizes = [sum(e // per == d for _, e in kept) for d in range(n)]
    back = x.new_empty((len(kept), x.shape[1]))
    dist.all_to_all_single(back, done, output_split_sizes=back_sizes, input_split_sizes=sizes)
    out = torch.zeros_like(x)
    for d, part in enumerate(back.split(back_sizes)):
        for t, row in zip([t for t, e in kept if e // per == d], part):
            out[t] += row
    return out
'''
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

MISTAKES.update({
    "capacity_dispatch drops after the all-to-all: the overflow travels, then is discarded": (
        CAPACITY, broken(CAPACITY, KEEP, "    really = before < limit\n    keep = torch.ones_like(really)  # send all\n")
        .replace(OUT, "    return torch.zeros_like(x).index_add_(0, token, back * really[order, None])\n"),
        ["world of 2", "which the capacity drops", "drop before the all-to-all", "the same numbers"], 60),
    "capacity_dispatch computes the capacity per rank, not per expert": (
        CAPACITY, broken(CAPACITY, LIMIT + "    flat = chosen.reshape(-1)  # token-major: the order in which the assignments queue\n"
                         "    one_hot = torch.nn.functional.one_hot(flat, num_experts)\n",
                         "    limit = math.ceil(capacity_factor * tokens * k / n)  # each rank's share\n"
                         "    flat = chosen.reshape(-1)\n"
                         "    one_hot = torch.nn.functional.one_hot(flat // (num_experts // n), n)\n"),
        ["world of 2", "as if the capacity were per rank", "it is per expert"], 60),
    "capacity_dispatch rounds the capacity down": (
        CAPACITY, broken(CAPACITY, LIMIT, LIMIT.replace("math.ceil", "math.floor")),
        ["world of 2", "rounded down (floor)", "ceil(capacity_factor * tokens * k / num_experts)"], 60),
    "capacity_dispatch keeps the last tokens of a full expert instead of the first": (
        CAPACITY, broken(CAPACITY, "    before = (one_hot.cumsum(dim=0) * one_hot)",
                         "    before = (one_hot.flip(0).cumsum(dim=0).flip(0) * one_hot)"),
        ["world of 2", "kept the last assignments", "not the first"], 60),
    "capacity_dispatch gives a dropped token its residual x instead of zero": (
        CAPACITY, broken(CAPACITY, OUT, "    out = torch.zeros_like(x).index_add_(0, token, back)\n"
                                        "    none = ~keep.reshape(tokens, k).any(dim=1)  # every choice dropped\n"
                                        "    out[none] = x[none]  # the token passes through\n"
                                        "    return out\n"),
        ["world of 2", "x itself added", "residual connection outside the layer"], 60),
    "capacity_dispatch sends every row to every rank: an all-gather in disguise": (
        CAPACITY, EVERY_ROW_EVERYWHERE, ["world of 2", "all-gather in disguise", "n times the traffic"], 60),
})

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
    "capacity_dispatch with a sort-based keep and torch's differentiable all_to_all_single": (
        CAPACITY, """import math

import torch
import torch.distributed as dist
from torch.distributed.nn.functional import all_to_all_single


def capacity_dispatch(x, chosen, compute, *, num_experts, capacity_factor):
    n = dist.get_world_size()
    flat = chosen.reshape(-1)
    limit = math.ceil(capacity_factor * len(chosen) * chosen.shape[1] / num_experts)
    by_expert = torch.sort(flat, stable=True).indices  # each expert's assignments together, in token order
    counts = torch.bincount(flat, minlength=num_experts)
    first = torch.cumsum(counts, 0) - counts  # where each expert's run starts in by_expert
    place = torch.arange(len(flat)) - first[flat[by_expert]]  # the place in its expert's queue
    sent = by_expert[place < limit]  # kept, already sorted by expert, so by rank
    expert, token = flat[sent], sent // chosen.shape[1]
    send = [int(((expert // (num_experts // n)) == d).sum()) for d in range(n)]
    incoming = torch.empty(n, dtype=torch.long)
    dist.all_to_all_single(incoming, torch.tensor(send))
    recv = incoming.tolist()
    rows = all_to_all_single(x.new_empty((sum(recv), x.shape[1])), x.index_select(0, token), recv, send)
    experts = expert.new_empty(sum(recv))
    dist.all_to_all_single(experts, expert, recv, send)
    back = all_to_all_single(x.new_empty((len(token), x.shape[1])), compute(rows, experts), send, recv)
    out = torch.zeros_like(x)
    for i, t in enumerate(token.tolist()):
        out[t] += back[i]
    return out
""", 60),
}
