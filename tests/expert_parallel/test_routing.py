"""Lesson 21 in one process: top-k gates, capacity, the balancing loss, the lesson's routings.

Each vectorised function is checked against a computation written another way: the loops of
``models.MixtureOfExperts``, every expert run on every token, or counts made by hand.

Covers ``ddp_tutorial.expert_parallel.routing``, ``ddp_tutorial.plots.experts`` and the
mixture-of-experts models of ``ddp_tutorial.models``.
"""

from __future__ import annotations

import pytest
import torch

from ddp_tutorial.expert_parallel.routing import (
    SCENARIOS,
    MoESetup,
    balance_run,
    capacity,
    dropped_fraction,
    keep_mask,
    load_balancing_loss,
    make_moe,
    moe_batch,
    top_k_gates,
)
from ddp_tutorial.models import MixtureOfExperts
from ddp_tutorial.plots.experts import token_matrix


def dense_reference(moe: MixtureOfExperts, x: torch.Tensor) -> torch.Tensor:
    """Every expert on every token, weighted by a (tokens, E) matrix of gates: zero where not chosen."""
    probs = torch.softmax(x @ moe.router.weight.T, dim=-1)
    top, chosen = probs.topk(moe.top_k, dim=-1)
    weights = torch.zeros_like(probs).scatter(1, chosen, top / top.sum(dim=-1, keepdim=True))
    every = torch.stack([expert(x) for expert in moe.experts], dim=1)  # (tokens, E, dim)
    return (weights[:, :, None] * every).sum(dim=1)


@pytest.mark.parametrize("top_k", [1, 2, 3])
def test_the_layer_equals_every_expert_on_every_token_weighted_by_the_gates(top_k):
    torch.manual_seed(0)
    moe = MixtureOfExperts(8, 16, 4, top_k)
    x = torch.randn(10, 8)
    assert torch.allclose(moe(x), dense_reference(moe, x), atol=1e-6)
    _, chosen, gates = top_k_gates(moe.router(x), top_k)
    assert torch.allclose(gates.sum(dim=-1), torch.ones(10))
    assert torch.equal(chosen, moe.route(x)[1])


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("factor", [0.5, 1.0, 1.5])
def test_keep_mask_keeps_what_the_loops_keep(seed, factor):
    gen = torch.Generator().manual_seed(seed)
    moe = MixtureOfExperts(8, 4, 4, 2, capacity_factor=factor)
    chosen = torch.stack([torch.randperm(4, generator=gen)[:2] for _ in range(12)])
    limit = capacity(6, 2, 4, factor)
    vectorised = torch.cat([keep_mask(chosen[:6], 4, limit), keep_mask(chosen[6:], 4, limit)])
    assert torch.equal(vectorised, moe.kept(chosen, groups=2))
    for group in (chosen[:6], chosen[6:]):  # no expert takes more than its capacity from a group
        assert torch.bincount(group[keep_mask(group, 4, limit)], minlength=4).max() <= limit


def test_capacity_is_the_even_share_times_the_factor_rounded_up():
    assert capacity(6, 2, 4, 1.0) == 3 and capacity(6, 2, 4, 1.25) == 4 and capacity(6, 1, 4, 0.5) == 1
    assert capacity(6, 2, 4, None) is None
    assert keep_mask(torch.zeros(5, 1, dtype=torch.long), 4, None).all()


def test_balancing_loss_is_one_when_even_and_e_when_all_go_to_one_expert():
    even_probs = torch.full((8, 4), 0.25)
    assert load_balancing_loss(even_probs, torch.arange(8).remainder(4)[:, None]).item() == pytest.approx(1.0)
    one_hot = torch.nn.functional.one_hot(torch.zeros(8, dtype=torch.long), 4).float()
    assert load_balancing_loss(one_hot, torch.zeros(8, 1, dtype=torch.long)).item() == pytest.approx(4.0)


def test_the_scenarios_route_as_they_say():
    for scenario in SCENARIOS:
        assert make_moe(MoESetup(scenario)).router.weight.shape == (4, 8)
    def first_choices(scenario):
        setup = MoESetup(scenario, top_k=1)
        x, _ = moe_batch(setup, 4)
        return make_moe(setup).route(x)[1][:, 0]
    for setup in (MoESetup("idle expert", top_k=1), MoESetup("idle expert", top_k=2)):
        x, _ = moe_batch(setup, 4)
        assert not (make_moe(setup).route(x)[1] == 3).any()  # the last expert receives nothing
    chosen = first_choices("one rank, one expert")
    assert (chosen[:6] == 3).all() and not (chosen[6:] == 3).any()  # rank 0: everything to expert 3, alone
    with pytest.raises(ValueError, match="unknown scenario"):
        make_moe(MoESetup("nope"))


def test_dropped_fraction_counts_the_choices_over_capacity():
    setup = MoESetup()
    dropped = dropped_fraction(setup, 4, [0.5, 1.0, 2.0])
    moe = make_moe(MoESetup(capacity_factor=1.0))
    x, _ = moe_batch(setup, 4)
    kept = moe.kept(moe.route(x)[1], groups=4)
    assert dropped[1] == pytest.approx(1 - kept.float().mean().item())
    assert dropped[0] >= dropped[1] >= dropped[2] == 0.0  # factor 2: room for every choice here


def test_the_balancing_loss_spreads_the_tokens():
    without, with_aux = balance_run(0.0, steps=12), balance_run(0.1, steps=12)
    assert without["counts"][0] == with_aux["counts"][0]  # the same start: expert 0 favoured
    assert min(with_aux["counts"][-1]) > 0 and min(without["counts"][-1]) == 0  # an expert starves without
    assert with_aux["aux"][-1] < without["aux"][-1]


def test_token_matrix_sums_each_ranks_experts():
    sent = [[1, 2, 0, 4], [0, 0, 5, 0]]  # 2 ranks, 2 experts each
    assert token_matrix(sent) == [[3, 4], [0, 5]]


def test_picture_writes_every_count():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ddp_tutorial.plots import plot_expert_load, plot_token_matrix

    ax = plot_token_matrix([[1, 2, 0, 4], [0, 0, 5, 0]])
    assert sorted(t.get_text() for t in ax.texts) == ["0", "3", "4", "5"]
    ax = plot_expert_load([[1, 2], [2, 1]])
    assert len(ax.lines) == 2
    plt.close("all")
