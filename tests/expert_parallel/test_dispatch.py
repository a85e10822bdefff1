"""Lesson 21: the experts over 1, 2 and 4 ranks equal one process, outputs and gradients.

Every setup (each routing of ``SCENARIOS``, top-1 and top-2, with and without a capacity) is
run split over the ranks and compared with ``one_process`` (``models.MixtureOfExperts``'s loops
on the global batch, a capacity group per rank). The tokens sent and received are checked
against the routing counted in one process.

Covers ``ddp_tutorial.expert_parallel.dispatch`` and ``ddp_tutorial.expert_parallel.ep_dp``.
"""

from __future__ import annotations

import pytest
import torch

from ddp_tutorial.expert_parallel.dispatch import TOLERANCE, compare, ep_worker, one_process
from ddp_tutorial.expert_parallel.ep_dp import ep_dp_worker, groups_of, train_one_process
from ddp_tutorial.expert_parallel.routing import SCENARIOS, MoESetup, make_moe, moe_batch
from ddp_tutorial.launch import spawn, torchrun
from ddp_tutorial.plots.experts import token_matrix

SETUPS = [MoESetup(scenario, top_k, factor) for scenario in SCENARIOS
          for top_k, factor in ((2, None), (1, None), (2, 1.0))]


def routed_counts(setup: MoESetup, world_size: int) -> list[list[int]]:
    """Tokens each rank sends each expert, counted in one process with the loops' capacity."""
    moe = make_moe(setup)
    x, _ = moe_batch(setup, world_size)
    chosen = moe.route(x)[1]
    keep = moe.kept(chosen, groups=world_size)
    n = setup.tokens_per_rank
    return [torch.bincount(chosen[r * n:(r + 1) * n][keep[r * n:(r + 1) * n]], minlength=4).tolist()
            for r in range(world_size)]


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_expert_parallel_equals_one_process_for_every_routing(world_size):
    import expert_workers

    runs = spawn(expert_workers.many_setups, world_size, args=(SETUPS,), timeout=90, quiet=True)
    for i, setup in enumerate(SETUPS):
        results = [runs[rank][i] for rank in range(world_size)]
        reference = one_process(setup, world_size)
        diff = compare(results, reference)
        assert max(diff.values()) < TOLERANCE, (setup, diff)
        if setup.top_k == 1:  # the router learns from the task loss (Switch's gate p; p / p = 1 gave < 1e-8
            # here): a gradient to compare, which test_routing checks against the dense layer and differences
            assert reference["router_grad"].abs().max() > 1e-5, setup
        sent = routed_counts(setup, world_size)
        assert [r["sent"].tolist() for r in results] == sent, setup
        matrix = token_matrix(sent)
        for dst, r in enumerate(results):  # what each rank received is its column of the matrix
            assert r["received"].sum(dim=1).tolist() == [row[dst] for row in matrix], (setup, dst)
        dropped = sum(r["dropped"] for r in results)
        assert dropped == world_size * setup.tokens_per_rank * setup.top_k - sum(map(sum, sent))
        assert (dropped > 0) == (setup.capacity_factor is not None), setup  # this data overflows factor 1
        for r in results:  # counts, dispatch, combine; backward: combine's and dispatch's, reversed
            assert r["collectives"] == {"forward": 3, "backward": 2}, setup


def test_the_uneven_routings_are_really_uneven():
    sent = token_matrix(routed_counts(MoESetup("one rank, one expert", top_k=1), 4))
    assert sent[0] == [0, 0, 0, 6]  # rank 0 sends everything to the last rank's expert
    idle = routed_counts(MoESetup("idle expert"), 4)
    assert all(row[3] == 0 for row in idle)  # expert 3 receives nothing at all


def test_a_world_that_does_not_divide_the_experts_is_refused():
    with pytest.raises(Exception, match="4 experts do not split evenly over 3 ranks"):
        spawn(ep_worker, 3, timeout=60, quiet=True)


@pytest.mark.parametrize("world_size, ep", [(2, 2), (4, 2)])
def test_expert_and_data_parallel_training_equals_one_process(world_size, ep):
    results = spawn(ep_dp_worker, world_size, args=(ep, 3), timeout=90, quiet=True)
    reference = train_one_process(world_size, 3)
    for rank, r in enumerate(results):
        assert (r["ep_group"], r["replicas"]) == groups_of(rank, world_size, ep)
        for name, value in r["state"].items():
            assert torch.allclose(value, reference["state"][name], atol=TOLERANCE), (rank, name)
        assert r["losses"] == pytest.approx(reference["losses"], abs=TOLERANCE)
    held = {name for r in results for name in r["state"]}
    assert held == set(reference["state"])  # every expert is somewhere
    from ddp_tutorial.expert_parallel.ep_dp import make_net

    start = dict(make_net().named_parameters())
    assert all(not torch.equal(start[n], p) for n, p in reference["state"].items() if "experts.3" not in n)  # trained


def test_groups_of_a_2x2_mesh():
    assert [groups_of(r, 4, 2) for r in range(4)] == [([0, 1], [0, 2]), ([0, 1], [1, 3]),
                                                      ([2, 3], [0, 2]), ([2, 3], [1, 3])]
    with pytest.raises(ValueError, match="expert-parallel size of 3 does not divide world_size=4"):
        groups_of(0, 4, 3)


@pytest.mark.slow  # a torchrun command: make test-slow (CI)
def test_module_runs_under_torchrun_and_prints_ok():
    result = torchrun("ddp_tutorial.expert_parallel.dispatch", nproc_per_node=2,
                      args=["--scenario", "one rank, one expert", "--capacity-factor", "1.0"], timeout=120)
    assert "OK: 4 experts over 2 rank(s) (one rank, one expert) equal one process" in result.output, result.output
