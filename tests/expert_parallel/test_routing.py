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
    bias_step,
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


def dense_reference(moe: MixtureOfExperts, x: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
    """Every expert on every token, weighted by a (tokens, E) matrix of gates: zero where not chosen.

    The gates written out again: Switch's probability itself for top-1, renormalised over the
    chosen for top-2 and more (Mixtral). ``weight``: another router weight (finite differences).
    """
    probs = torch.exp(x @ (moe.router.weight if weight is None else weight).T)
    probs = probs / probs.sum(dim=-1, keepdim=True)
    chosen = probs.argsort(dim=-1, descending=True)[:, :moe.top_k]
    mask = torch.zeros_like(probs).scatter(1, chosen, 1.0)
    weights = probs * mask
    if moe.top_k > 1:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    every = torch.stack([expert(x) for expert in moe.experts], dim=1)  # (tokens, E, dim)
    return (weights[:, :, None] * every).sum(dim=1)


@pytest.mark.parametrize("top_k", [1, 2, 3])
def test_the_layer_equals_every_expert_on_every_token_weighted_by_the_gates(top_k):
    torch.manual_seed(0)
    moe = MixtureOfExperts(8, 16, 4, top_k)
    x = torch.randn(10, 8)
    assert torch.allclose(moe(x), dense_reference(moe, x), atol=1e-6)
    probs, chosen, gates = top_k_gates(moe.router(x), top_k)
    if top_k == 1:  # Switch: the probability itself, below 1
        assert torch.equal(gates[:, 0], probs.max(dim=-1).values) and (gates < 1).all()
    else:  # Mixtral: renormalised over the chosen
        assert torch.allclose(gates.sum(dim=-1), torch.ones(10))
    assert torch.equal(chosen, moe.route(x)[1])


def test_normalize_topk_is_an_option_and_kills_the_top1_router_gradient():
    logits = torch.randn(5, 4, generator=torch.Generator().manual_seed(0))
    probs, _, gates = top_k_gates(logits, 2, normalize_topk=False)  # DeepSeek-V2: unnormalised
    assert torch.allclose(gates, probs.topk(2).values) and (gates.sum(dim=-1) < 1).all()
    assert torch.allclose(top_k_gates(logits, 1, normalize_topk=True)[2], torch.ones(5, 1))  # p / p
    for normalize, zero in ((None, False), (True, True)):
        moe = make_moe(MoESetup("random", top_k=1, normalize_topk=normalize))
        x, target = moe_batch(MoESetup(), 2)
        torch.nn.functional.mse_loss(moe(x), target).backward()
        assert (moe.router.weight.grad.abs().max() < 1e-6) == zero, normalize


@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("top_k", [1, 2])
def test_the_router_gradient_is_the_dense_ones_and_finite_differences(scenario, top_k):
    """Top-1 included: the task loss moves the router (a non-zero gradient), as autograd through
    the dense reference and central differences (float64) say."""
    setup = MoESetup(scenario, top_k=top_k)
    moe = make_moe(setup).double()
    x, target = (t.double() for t in moe_batch(setup, 2))
    torch.nn.functional.mse_loss(moe(x), target).backward()
    loops = moe.router.weight.grad.clone()
    moe.zero_grad()
    torch.nn.functional.mse_loss(dense_reference(moe, x), target).backward()
    assert torch.allclose(loops, moe.router.weight.grad, atol=1e-12)
    assert loops.abs().max() > 1e-3  # a gradient, also for top-1
    w, eps = moe.router.weight.detach(), 1e-6
    for i, j in ((0, 0), (1, 3), (3, 5)):
        bump = torch.zeros_like(w)
        bump[i, j] = eps
        with torch.no_grad():
            up, down = (torch.nn.functional.mse_loss(dense_reference(moe, x, w + s * bump), target) for s in (1, -1))
        assert float((up - down) / (2 * eps)) == pytest.approx(float(loops[i, j]), abs=1e-7)


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


def test_first_choices_first_is_gshards_order_and_differs_from_token_order():
    chosen = torch.tensor([[0, 1], [1, 0], [1, 2]])  # token 0's second choice, expert 1, queues early
    token_major, choice_major = (keep_mask(chosen, 4, 1, first_choices_first=f) for f in (False, True))
    assert token_major.tolist() == [[True, True], [False, False], [False, True]]
    assert choice_major.tolist() == [[True, False], [True, False], [False, True]]  # token 1's first choice wins
    moe = MixtureOfExperts(8, 4, 4, 2, capacity_factor=0.5, first_choices_first=True)
    gen = torch.Generator().manual_seed(3)
    many = torch.stack([torch.randperm(4, generator=gen)[:2] for _ in range(12)])
    limit = capacity(6, 2, 4, 0.5)
    vectorised = torch.cat([keep_mask(g, 4, limit, first_choices_first=True) for g in (many[:6], many[6:])])
    assert torch.equal(vectorised, moe.kept(many, groups=2))


def test_capacity_is_the_even_share_times_the_factor_rounded_up():
    assert capacity(6, 2, 4, 1.0) == 3 and capacity(6, 2, 4, 1.25) == 4 and capacity(6, 1, 4, 0.5) == 1
    assert capacity(6, 2, 4, None) is None
    assert keep_mask(torch.zeros(5, 1, dtype=torch.long), 4, None).all()


def test_balancing_loss_is_one_when_f_or_p_is_uniform_and_at_most_e_over_k():
    even_probs = torch.full((8, 4), 0.25)
    assert load_balancing_loss(even_probs, torch.arange(8).remainder(4)[:, None]).item() == pytest.approx(1.0)
    skewed = torch.zeros(8, 2, dtype=torch.long)  # f not uniform at all, P uniform: still 1
    assert load_balancing_loss(even_probs, skewed).item() == pytest.approx(1.0)
    probs = torch.softmax(torch.randn(8, 4, generator=torch.Generator().manual_seed(0)), dim=-1)
    assert load_balancing_loss(probs, torch.arange(8).remainder(4)[:, None]).item() == pytest.approx(1.0)  # f uniform
    for k in (1, 2, 3):  # collapsed: every token on experts 0..k-1, all the probability there
        probs = torch.zeros(8, 4)
        probs[:, :k] = 1 / k
        chosen = torch.arange(k).repeat(8, 1)
        assert load_balancing_loss(probs, chosen).item() == pytest.approx(4 / k)  # E/k, not E
    gen = torch.Generator().manual_seed(1)
    for _ in range(20):  # and never above it, with chosen = each token's top-k
        probs = torch.softmax(5 * torch.randn(16, 4, generator=gen), dim=-1)
        assert load_balancing_loss(probs, probs.topk(2).indices).item() <= 2 + 1e-6


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


def test_the_selection_bias_chooses_but_never_weights():
    logits = torch.randn(6, 4, generator=torch.Generator().manual_seed(2))
    bias = torch.tensor([0.0, 0.0, 0.0, 5.0])  # expert 3 wins every selection ...
    probs, chosen, gates = top_k_gates(logits, 1, selection_bias=bias)
    assert (chosen == 3).all()
    assert torch.equal(gates[:, 0], probs[:, 3])  # ... and weighs by its own probability, bias-free
    counts = torch.tensor([10, 2, 6, 6])
    assert bias_step(torch.zeros(4), counts, 0.1).tolist() == pytest.approx([-0.1, 0.1, 0.0, 0.0])


def test_bias_balancing_spreads_the_tokens_without_an_auxiliary_loss():
    without, biased = balance_run(0.0, steps=20), balance_run(0.0, steps=20, bias_gamma=0.01)
    assert without["counts"][0] == biased["counts"][0]
    assert min(without["counts"][-1]) == 0 and min(biased["counts"][-1]) >= 16  # within 2x of the even 32
