"""The mixture of experts of lesson 21 (``21_expert_parallel``): ``top_k_gates`` (the one home of the gate
rule), ``ExpertMLP``, ``MixtureOfExperts`` (router, top-k gates, capacity) and ``TinyMoENet``.
"""

from __future__ import annotations

import math

import torch
from torch import nn


def top_k_gates(logits: torch.Tensor, top_k: int, normalize_topk: bool | None = None, *,
                selection_bias: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(probs, chosen, gates)`` from the router's logits (tokens, E): softmax probabilities (tokens, E),
    each token's ``top_k`` experts (tokens, k) and the gates that weight their outputs (tokens, k).

    ``normalize_topk`` (HF's ``norm_topk_prob``): the chosen probabilities rescaled to sum to 1
    (Mixtral and GShard, top-2) or left as they are (Switch, top-1; DeepSeek-V2). ``None``, the
    default, renormalises only when ``top_k >= 2``: with one expert the renormalised gate is
    ``p / p = 1``, a constant, and the task loss gives the router no gradient at all (which is why
    Switch, Fedus et al. 2021, section 2.1, weights by ``p`` itself).

    ``selection_bias`` (E,): added to the probabilities to *choose* the experts, never to weight
    them (DeepSeek-V3's auxiliary-loss-free balancing, arXiv:2412.19437, section 2.1.2).
    """
    probs = torch.softmax(logits, dim=-1)
    if selection_bias is None:
        top, chosen = probs.topk(top_k, dim=-1)
    else:
        chosen = (probs + selection_bias).topk(top_k, dim=-1).indices
        top = probs.gather(-1, chosen)
    if normalize_topk is None:
        normalize_topk = top_k >= 2
    return probs, chosen, top / top.sum(dim=-1, keepdim=True) if normalize_topk else top


class ExpertMLP(nn.Module):
    """One expert of a mixture: Linear(dim, hidden) -> ReLU -> Linear(hidden, dim)."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.up, self.down = nn.Linear(dim, hidden), nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(x)))


class MixtureOfExperts(nn.Module):
    """A top-k routed mixture-of-experts layer, computed in one process (``21_expert_parallel``).

    The router scores each token against every expert (a bias-free linear), softmax makes the
    scores probabilities, each token goes to its ``top_k`` most probable experts, and their
    probabilities weight the experts' outputs: ``top_k_gates``, renormalised to sum to 1 for
    ``top_k >= 2`` (Mixtral), as they are for top-1 (Switch), or as ``normalize_topk`` says.
    With a ``capacity_factor`` the tokens are cut into ``groups`` equal groups (GShard's groups:
    one per rank under expert parallelism) and in each group an expert takes at most
    ``ceil(factor * group_tokens * top_k / num_experts)`` tokens, first come in token order (a
    teaching simplification: see ``kept``); a token an expert drops gets nothing from it. Written
    as plain loops: the reference that ``expert_parallel.dispatch`` must equal.
    """

    def __init__(self, dim: int = 8, hidden: int = 16, num_experts: int = 4, top_k: int = 2, *,
                 capacity_factor: float | None = None, normalize_topk: bool | None = None,
                 first_choices_first: bool = False):
        super().__init__()
        self.num_experts, self.top_k, self.capacity_factor = num_experts, top_k, capacity_factor
        self.normalize_topk, self.first_choices_first = normalize_topk, first_choices_first
        self.selection_bias: torch.Tensor | None = None  # (E,), set by bias balancing: a state, not a weight
        self.router = nn.Linear(dim, num_experts, bias=False)
        self.experts = nn.ModuleList(ExpertMLP(dim, hidden) for _ in range(num_experts))

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(probs, chosen, gates)``: every expert's probability (tokens, E), each token's
        ``top_k`` experts (tokens, k) and their weights (tokens, k), by ``top_k_gates``."""
        return top_k_gates(self.router(x), self.top_k, self.normalize_topk, selection_bias=self.selection_bias)

    def kept(self, chosen: torch.Tensor, groups: int = 1) -> torch.Tensor:
        """(tokens, k) booleans: which of the choices their expert takes (all, without a capacity).

        Token-major (token 0's choices, then token 1's, ...): token t's second choice can take a slot
        before token t+1's first, a simplification. ``first_choices_first``: every token's first
        choice, then every second choice (GShard, Lepikhin et al. 2020, Algorithm 1).
        """
        keep = torch.ones_like(chosen, dtype=torch.bool)
        if self.capacity_factor is None:
            return keep
        per_group = len(chosen) // groups
        limit = math.ceil(self.capacity_factor * per_group * self.top_k / self.num_experts)
        for g in range(groups):
            tokens = range(g * per_group, (g + 1) * per_group)
            if self.first_choices_first:
                order = [(t, slot) for slot in range(self.top_k) for t in tokens]
            else:
                order = [(t, slot) for t in tokens for slot in range(self.top_k)]
            taken = [0] * self.num_experts
            for t, slot in order:
                e = int(chosen[t, slot])
                keep[t, slot] = taken[e] < limit
                taken[e] += 1
        return keep

    def forward(self, x: torch.Tensor, groups: int = 1) -> torch.Tensor:
        _, chosen, gates = self.route(x)
        keep = self.kept(chosen, groups)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            token, slot = torch.nonzero((chosen == e) & keep, as_tuple=True)
            if len(token):
                out = out.index_add(0, token, gates[token, slot, None] * expert(x[token]))
        return out


class TinyMoENet(nn.Module):
    """Linear -> residual mixture of experts -> Linear: dense layers around an MoE (``21_expert_parallel``).

    Under expert parallelism ``moe`` is split over ranks and ``inp``/``out`` are data-parallel.
    """

    def __init__(self, dim: int = 8, hidden: int = 16, num_experts: int = 4, top_k: int = 2, *,
                 capacity_factor: float | None = None, normalize_topk: bool | None = None):
        super().__init__()
        self.inp, self.out = nn.Linear(dim, dim), nn.Linear(dim, dim)
        self.moe = MixtureOfExperts(dim, hidden, num_experts, top_k, capacity_factor=capacity_factor,
                                    normalize_topk=normalize_topk)

    def forward(self, x: torch.Tensor, groups: int = 1) -> torch.Tensor:
        h = self.inp(x)
        return self.out(h + self.moe(h, groups))
