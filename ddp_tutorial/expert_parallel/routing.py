"""Routing tokens to experts in one process: top-k gates, capacity, the balancing loss (``21_expert_parallel``).

A mixture-of-experts layer (``models.MixtureOfExperts``) sends each token to ``top_k`` of
``num_experts`` expert MLPs chosen by a router. Everything here is a pure function of the
router's output, the same on one process and on every rank of expert parallelism:

- ``top_k_gates`` (its home is ``models.moe``): softmax over the experts, each token's ``k`` best,
  their probabilities as gates, renormalised to sum to 1 only for ``k >= 2`` (``normalize_topk``);
- ``capacity`` and ``keep_mask``: an expert takes at most ``ceil(factor * tokens * k / E)``
  assignments of a group (the capacity of Switch, Fedus et al. 2021, arXiv:2101.03961, section 2.2,
  and GShard, Lepikhin et al. 2020, arXiv:2006.16668); which ones, first come in token order, is
  this course's simplification (GShard fills every first choice before any second one:
  ``first_choices_first``; Megatron-Core drops the lowest probabilities by default);
- ``load_balancing_loss``: Switch's ``E * sum_e f_e * P_e``, ``f_e`` the fraction of the
  assignments expert ``e`` got and ``P_e`` its mean probability; 1 when either is uniform, at most
  ``E / k`` (every token on the same ``k`` experts, all the probability on them);
- ``balance_run``: a few steps of training with the balancing loss, or with DeepSeek-V3's
  auxiliary-loss-free bias instead (``bias_step``: ``b_e -= gamma`` if expert ``e`` is overloaded,
  ``+= gamma`` if underloaded, the bias used to choose only);
- ``make_moe`` and ``moe_batch``: the layer and the tokens of the lesson's routings
  (``SCENARIOS``), the uneven ones made on purpose.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

import torch

from ddp_tutorial.models import MixtureOfExperts
from ddp_tutorial.models.moe import top_k_gates

__all__ = ["SCENARIOS", "DIM", "MoESetup", "top_k_gates", "capacity", "keep_mask", "expert_counts", "load_balancing_loss",
           "make_moe", "moe_batch", "dropped_fraction", "bias_step", "balance_run", "main"]

DIM = 8  # the model width of every layer in the lesson: tiny, so a CPU runs it at once
# random: whatever the router says; idle expert: the last expert is never chosen;
# one rank, one expert: rank 0's first choice is always the last expert, which no other rank picks first
SCENARIOS = ("random", "idle expert", "one rank, one expert")


@dataclass(frozen=True)
class MoESetup:
    """One run of the lesson's layer: which routing, how many experts, how many tokens per rank."""

    scenario: str = "random"
    top_k: int = 2
    capacity_factor: float | None = None  # None: every expert takes every token sent to it
    num_experts: int = 4
    tokens_per_rank: int = 6
    hidden: int = 16
    seed: int = 0
    normalize_topk: bool | None = None  # None: renormalise the gates for top_k >= 2 only (top_k_gates)


def capacity(tokens: int, top_k: int, num_experts: int, factor: float | None) -> int | None:
    """Most assignments one expert takes from a group of ``tokens`` (None: no limit).

    Factor 1 is the even share ``tokens * k / E``; a larger factor leaves room for imbalance.
    """
    return None if factor is None else math.ceil(factor * tokens * top_k / num_experts)


def keep_mask(chosen: torch.Tensor, num_experts: int, limit: int | None, *,
              first_choices_first: bool = False) -> torch.Tensor:
    """(tokens, k) booleans: which choices their expert keeps, the first ``limit`` in token order.

    Vectorised (the loops of ``MixtureOfExperts.kept`` are the reference): the assignments
    in token-major order, a running count per expert, kept while the count is within the limit.
    ``first_choices_first``: choice-major instead, every first choice before any second (GShard).
    """
    if limit is None:
        return torch.ones_like(chosen, dtype=torch.bool)
    order = chosen.T if first_choices_first else chosen  # the order in which the assignments queue
    one_hot = torch.nn.functional.one_hot(order.reshape(-1), num_experts)  # (tokens * k, E)
    position = (one_hot.cumsum(dim=0) * one_hot).sum(dim=1) - 1  # how many came before, per expert
    keep = (position < limit).reshape(order.shape)
    return keep.T if first_choices_first else keep


def expert_counts(chosen: torch.Tensor, keep: torch.Tensor, num_experts: int) -> torch.Tensor:
    """Tokens each expert takes: (E,) int64."""
    return torch.bincount(chosen[keep], minlength=num_experts)


def load_balancing_loss(probs: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
    """Switch Transformer's auxiliary loss ``E * sum_e f_e * P_e`` (Fedus et al. 2021, section 2.2).

    ``f_e`` (counted, no gradient) is the fraction of the assignments that chose expert ``e``;
    ``P_e`` (differentiable) its mean router probability. It is 1 when either ``f`` or ``P`` is
    uniform, and at most ``E / k``: a token takes ``k`` distinct experts, so ``f_e <= 1/k``. The
    gradient lowers the probability of the experts that got more than their share.
    """
    num_experts = probs.shape[-1]
    fraction = torch.bincount(chosen.reshape(-1), minlength=num_experts).to(probs.dtype) / chosen.numel()
    return num_experts * (fraction * probs.mean(dim=0)).sum()


def make_moe(setup: MoESetup = MoESetup()) -> MixtureOfExperts:
    """The lesson's layer, its router set up for ``setup.scenario`` (``SCENARIOS``); same seed, same weights."""
    if setup.scenario not in SCENARIOS:
        raise ValueError(f"unknown scenario {setup.scenario!r}; choose one of {SCENARIOS}")
    torch.manual_seed(setup.seed)
    moe = MixtureOfExperts(DIM, setup.hidden, setup.num_experts, setup.top_k, capacity_factor=setup.capacity_factor,
                           normalize_topk=setup.normalize_topk)
    with torch.no_grad():
        if setup.scenario == "idle expert":  # tokens are positive there: this row scores far below the others
            moe.router.weight[-1] = -1.0
        elif setup.scenario == "one rank, one expert":  # the last expert listens to feature 0 only
            moe.router.weight[-1] = 0.0
            moe.router.weight[-1, 0] = 3.0
    return moe


def moe_batch(setup: MoESetup, world_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch ``(x, target)``, (world_size * tokens_per_rank, DIM); rank r holds rows r*n .. (r+1)*n."""
    n = setup.tokens_per_rank
    gen = torch.Generator().manual_seed(setup.seed + 1)
    x = torch.randn(world_size * n, DIM, generator=gen)
    target = torch.randn(world_size * n, DIM, generator=gen)
    if setup.scenario == "idle expert":
        x = x.abs()
    elif setup.scenario == "one rank, one expert":
        x[:, 0] = -1.0 - x[:, 0].abs()  # nobody scores the last expert high ...
        x[:n, 0] = 3.0 + x[:n, 1].abs()  # ... except rank 0's tokens
    return x, target


def dropped_fraction(setup: MoESetup, world_size: int, factors: list[float]) -> list[float]:
    """For each capacity factor, the fraction of (token, expert) assignments dropped, each rank a group."""
    moe = make_moe(setup)
    x, _ = moe_batch(setup, world_size)
    with torch.no_grad():
        _, chosen, _ = moe.route(x)
    n = setup.tokens_per_rank
    out = []
    for factor in factors:
        limit = capacity(n, setup.top_k, setup.num_experts, factor)
        kept = sum(int(keep_mask(chosen[g * n:(g + 1) * n], setup.num_experts, limit).sum())
                   for g in range(world_size))
        out.append(1 - kept / chosen.numel())
    return out


def bias_step(bias: torch.Tensor, counts: torch.Tensor, gamma: float) -> torch.Tensor:
    """DeepSeek-V3's update after a step (arXiv:2412.19437, section 2.1.2): each expert's selection bias
    ``- gamma`` if it took more than the mean load, ``+ gamma`` if less; outside the gradient."""
    return bias - gamma * torch.sign(counts.to(bias.dtype) - counts.float().mean())


def balance_run(aux_weight: float, steps: int = 30, setup: MoESetup = MoESetup(tokens_per_rank=64), *,
                bias_gamma: float = 0.0) -> dict:
    """Train the layer alone in one process (Adam, a fixed regression) with ``aux_weight`` times the
    balancing loss added, and, with ``bias_gamma``, a selection bias moved by ``bias_step`` after each
    step: the tokens per expert and the balancing loss at every step."""
    moe = make_moe(setup)
    if bias_gamma:
        moe.selection_bias = torch.zeros(setup.num_experts)
    with torch.no_grad():
        moe.router.weight[0] += 0.2  # a router that starts out favouring expert 0 ...
    x, target = moe_batch(setup, 1)
    x = x.abs()  # ... for every token, since every feature is positive
    opt = torch.optim.Adam(moe.parameters(), lr=0.02)
    counts, aux = [], []
    for _ in range(steps):
        probs, chosen, _ = moe.route(x)
        balance = load_balancing_loss(probs, chosen)
        loss = torch.nn.functional.mse_loss(moe(x), target) + aux_weight * balance
        opt.zero_grad()
        loss.backward()
        opt.step()
        load = torch.bincount(chosen.reshape(-1), minlength=setup.num_experts)
        if bias_gamma:
            moe.selection_bias = bias_step(moe.selection_bias, load, bias_gamma)
        counts.append(load.tolist())
        aux.append(balance.item())
    return {"counts": counts, "aux": aux}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    setup = MoESetup()
    factors = [0.5, 1.0, 1.25, 1.5, 2.0]
    dropped = dropped_fraction(setup, 4, factors)
    print("capacity factor -> dropped fraction (4 groups of 6 tokens, top-2 of 4 experts):")
    print("  " + ", ".join(f"{f:g}: {d:.2f}" for f, d in zip(factors, dropped)))
    for weight in (0.0, 0.1):
        run = balance_run(weight, args.steps)
        print(f"aux weight {weight:g}: tokens per expert {run['counts'][0]} -> {run['counts'][-1]}, "
              f"balancing loss {run['aux'][0]:.3f} -> {run['aux'][-1]:.3f}")


if __name__ == "__main__":
    main()
