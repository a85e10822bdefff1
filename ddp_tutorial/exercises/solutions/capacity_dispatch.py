"""Exercise 21.2, reference solution: expert-parallel dispatch with a capacity, the overflow dropped before it travels.

Each expert takes at most ``C = ceil(capacity_factor * tokens * k / num_experts)`` of this
rank's (token, expert) assignments: Switch Transformer's expert capacity (Fedus et al. 2021,
arXiv:2101.03961, section 2.2: "(tokens per batch / number of experts) x capacity factor"),
with ``k`` choices per token as in GShard, rounded up as lesson 21's ``capacity`` does. Each
rank's tokens are one group, so the capacity is decided where the tokens are, before the
all-to-all: a dropped assignment costs no bandwidth. Kept: the first ``C`` in token order.

1. **keep**: the assignments in token order (``chosen`` row by row); a running count per
   expert, ``cumsum`` of a one-hot, says how many came before each one at its expert;
2. **counts**: the kept assignments sorted by expert (so by destination rank, whose experts are
   a contiguous block), their number per rank out, the peers' in;
3. **dispatch**: the kept rows and their experts' numbers, by those split sizes;
4. **combine**: ``compute`` on what arrived, the results back with the sizes swapped, each
   added to its token's row (``index_add_``: a token with two kept choices gets both, a token
   with none keeps zeros: the residual connection outside the layer carries it).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.distributed as dist


def capacity_dispatch(x: torch.Tensor, chosen: torch.Tensor,
                      compute: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], *,
                      num_experts: int, capacity_factor: float) -> torch.Tensor:
    """The output of an expert-parallel MoE layer whose experts take at most ``C`` assignments each from this rank.

    ``x`` (tokens, features) are this rank's tokens; ``chosen`` (tokens, k), int64, the ``k``
    different experts each token chose (numbers ``0 .. num_experts - 1``). The experts are split
    over the ``n`` ranks in equal contiguous blocks: rank ``r`` holds experts
    ``r * num_experts / n`` to ``(r + 1) * num_experts / n - 1``. A rank may hold no token.

    Capacity: each expert takes at most ``C = ceil(capacity_factor * tokens * k / num_experts)``
    of this rank's assignments (``tokens`` = this rank's number of tokens), the first ``C`` in
    token order: token ``t``'s choices, in the order of ``chosen[t]``, before token ``t + 1``'s.
    The others are dropped on this rank: only kept assignments travel, one row each.

    Every rank calls ``compute(rows, experts)`` once, on all the rows that arrived, in any order,
    with each row's expert number (one of this rank's experts); it works row by row and returns
    a tensor shaped like ``rows``. Return ``out``, shaped like ``x``: ``out[t]`` is the sum, over
    token ``t``'s kept choices ``e``, of what ``compute`` on ``e``'s rank made of ``x[t]`` for
    ``e``. A dropped choice adds nothing: a token whose every choice was dropped gets a row of
    zeros (the residual connection outside the layer carries it on; do not add ``x``). No
    gradient is needed. Use ``dist.all_to_all_single`` only; two of those calls carry rows (the
    dispatch and the combine), each exactly the kept ones. Step by step:
    ``show("capacity_dispatch", hint=1)``, 2, 3.
    """
    n = dist.get_world_size()
    tokens, k = chosen.shape
    limit = math.ceil(capacity_factor * tokens * k / num_experts)
    flat = chosen.reshape(-1)  # token-major: the order in which the assignments queue
    one_hot = torch.nn.functional.one_hot(flat, num_experts)
    before = (one_hot.cumsum(dim=0) * one_hot).sum(dim=1) - 1  # assignments ahead of this one at its expert
    keep = before < limit
    token = torch.arange(tokens, device=x.device).repeat_interleave(k)[keep]
    expert = flat[keep]
    order = torch.argsort(expert, stable=True)  # by expert, so by rank: the parts of the send buffer
    token, expert = token[order], expert[order]
    send_counts = torch.bincount(expert // (num_experts // n), minlength=n)
    recv_counts = torch.empty_like(send_counts)
    dist.all_to_all_single(recv_counts, send_counts)
    send, recv = send_counts.tolist(), recv_counts.tolist()
    rows = x.new_empty((sum(recv), x.shape[1]))
    dist.all_to_all_single(rows, x[token], output_split_sizes=recv, input_split_sizes=send)
    experts = expert.new_empty(sum(recv))
    dist.all_to_all_single(experts, expert, output_split_sizes=recv, input_split_sizes=send)
    back = x.new_empty((len(token), x.shape[1]))
    dist.all_to_all_single(back, compute(rows, experts).contiguous(), output_split_sizes=send, input_split_sizes=recv)
    return torch.zeros_like(x).index_add_(0, token, back)
