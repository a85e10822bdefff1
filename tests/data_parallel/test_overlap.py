"""ddp_tutorial.data_parallel.overlap: the local variant communicates with nobody; the replayed messages are the wrappers' own;
over a simulated link only buckets leave during backward. Also covers ``ddp_tutorial.plots.timelines.plot_exposed``."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.distributed as dist
from torch import nn

from ddp_tutorial.data_parallel.ddp_from_scratch import WRAPPERS
from ddp_tutorial.data_parallel.link import SimulatedLink
from ddp_tutorial.data_parallel.overlap import (
    RUNGS,
    exposed_communication,
    exposed_report,
    link_report,
    message_sizes,
    over_simulated_link,
    slowest_rank,
    wrap_rung,
)
from ddp_tutorial.launch import spawn
from ddp_tutorial.models import make_model

pytestmark = pytest.mark.timeout(180)


def local_and_world_grads(rank: int, world_size: int) -> dict:
    """For each rung: max |grad - plain local grad| on a group of one, and on the world (against the mean)."""
    base, (n_in, n_out) = make_model("mlp", seed=0, dtype=torch.float64)
    alone = [dist.new_group([r]) for r in range(world_size)][rank]
    x = torch.randn(6, n_in, generator=torch.Generator().manual_seed(rank), dtype=torch.float64)

    def grads(model):
        model(x).square().mean().backward()
        return [p.grad.clone() for p in (model.module if hasattr(model, "module") else model).parameters()]

    plain = grads(copy.deepcopy(base))  # no wrapper at all: this rank's own gradients
    mean = []
    for g in plain:  # the world's mean, computed another way: all_gather, then average
        parts = [torch.empty_like(g) for _ in range(world_size)]
        dist.all_gather(parts, g)
        mean.append(torch.stack(parts).mean(0))
    out = {}
    for kind in RUNGS:
        solo = grads(wrap_rung(kind, copy.deepcopy(base), alone))
        world = grads(wrap_rung(kind, copy.deepcopy(base)))
        out[kind] = (max((a - b).abs().max().item() for a, b in zip(solo, plain)),
                     max((a - b).abs().max().item() for a, b in zip(world, mean)))
    return out


def test_a_group_of_one_gives_local_gradients_and_the_world_gives_their_mean():
    for per_rank in spawn(local_and_world_grads, 2, timeout=120):
        for kind, (solo_gap, world_gap) in per_rank.items():
            assert solo_gap < 1e-12 and world_gap < 1e-12, (kind, solo_gap, world_gap)


def sizes_of_every_rung(rank: int, world_size: int) -> dict:
    base, (n_in, n_out) = make_model("big", seed=0)
    x, y = torch.randn(4, n_in), torch.randn(4, n_out)
    step = lambda m: nn.functional.mse_loss(m(x), y).backward()  # noqa: E731  (a one-line helper, read beside its only use)
    return {"numels": [p.numel() for p in base.parameters()],
            **{kind: message_sizes(kind, wrap_rung(kind, copy.deepcopy(base)), step) for kind in RUNGS}}


def test_each_rung_sends_every_gradient_once():
    result = spawn(sizes_of_every_rung, 2, timeout=120)[0]
    numels = result["numels"]
    assert result["naive"] == numels  # one all-reduce per tensor (in parameter order)
    assert result["flat"] == [sum(numels)]
    for kind in ("bucketed", "torch"):  # buckets: the tensors split, none left out or sent twice
        assert sum(result[kind]) == sum(numels) and 1 < len(result[kind]) < len(numels), (kind, result[kind])


def test_exposed_communication_reports_every_rung():
    results = spawn(exposed_communication, 2, args=(RUNGS, 1, 2), timeout=150)
    for per_rank in results:
        assert set(per_rank) == set(RUNGS)
        for kind, row in per_rank.items():
            assert all(0 < row[what] < 10 and math.isfinite(row[what]) for what in ("step", "local", "comm"))
        assert per_rank["naive"]["messages"] == 32 and per_rank["flat"]["messages"] == 1


def grads_over_a_link(rank: int, world_size: int) -> dict:
    """Each from-scratch wrapper sending through a fast SimulatedLink: max |grad - mean by all_gather|."""
    base, (n_in, _) = make_model("shared", seed=0, dtype=torch.float64)
    x = torch.randn(6, n_in, generator=torch.Generator().manual_seed(rank), dtype=torch.float64)
    out = {}
    for kind, wrapper in WRAPPERS.items():
        link = SimulatedLink(bandwidth=1e9)
        ddp = wrapper(copy.deepcopy(base), link=link)
        ddp(x).square().mean().backward()
        plain = copy.deepcopy(base)
        plain(x).square().mean().backward()
        gaps = []
        for got, p in zip(ddp.module.parameters(), plain.parameters()):
            parts = [torch.empty_like(p.grad) for _ in range(world_size)]
            dist.all_gather(parts, p.grad)
            gaps.append((got.grad - torch.stack(parts).mean(0)).abs().max().item())
        out[kind] = (max(gaps), sum(what == "send" for what, _, _ in link.events))
        link.close()
    return out


def test_the_wrappers_over_a_link_still_average_and_send_through_it():
    for per_rank in spawn(grads_over_a_link, 2, timeout=120):
        for kind, (gap, sends) in per_rank.items():
            assert gap < 1e-12 and sends >= 1, (kind, gap, sends)


def test_over_a_simulated_link_only_buckets_send_before_backward_ends():
    bandwidth = 1e9
    results = spawn(over_simulated_link, 2, args=(bandwidth, 0.5, 8, 1), timeout=150)
    base, _ = make_model("big", seed=0)
    nbytes = sum(p.numel() * p.element_size() for p in base.parameters())
    for per_rank in results:
        flat, bucketed = per_rank["flat"], per_rank["bucketed"]
        assert (flat["messages"], flat["early"]) == (1, 0)  # FlatDDP sends once, after backward
        # BucketedDDP: every bucket but the one holding backward's last gradient leaves during backward
        assert bucketed["messages"] > 2 and bucketed["early"] == bucketed["messages"] - 1
        for row in (flat, bucketed):  # 2 ranks: a ring sends 2 (N-1)/N = 1 times the bytes
            assert row["wire"] == pytest.approx(nbytes / bandwidth)
            assert row["step"] > 0 and row["local"] > 0


def test_slowest_rank_takes_the_larger_time_and_the_report_subtracts_local():
    per_rank = [{"flat": {"step": 0.010, "local": 0.004, "wire": 0.003, "messages": 1}},
                {"flat": {"step": 0.012, "local": 0.003, "wire": 0.003, "messages": 1}}]
    timed = slowest_rank(per_rank)
    assert timed == {"flat": {"step": 0.012, "local": 0.004, "wire": 0.003, "messages": 1}}
    report = exposed_report(timed, alone="wire")
    assert "wire time" in report.splitlines()[0]
    assert report.splitlines()[1].split()[:5] == ["FlatDDP", "12.00", "4.00", "8.00", "3.00"]


def test_plot_exposed_draws_a_pair_of_bars_per_wrapper():
    import matplotlib
    matplotlib.use("Agg")
    from ddp_tutorial.plots import plot_exposed

    timed = {"flat": {"step": 0.012, "local": 0.004, "wire": 0.003}, "bucketed": {"step": 0.008, "local": 0.004, "wire": 0.003}}
    ax = plot_exposed(timed, alone="wire", title="t")
    heights = [round(bar.get_height(), 6) for bar in ax.patches]
    assert heights == [8.0, 4.0, 3.0, 3.0]  # exposed bars first, then the wire bars
    assert [t.get_text() for t in ax.get_xticklabels()] == ["FlatDDP", "BucketedDDP"]


def test_link_report_and_plot_compare_each_step_with_flat_ddp():
    import matplotlib
    matplotlib.use("Agg")
    from ddp_tutorial.plots import plot_link_steps

    timed = {"flat": {"step": 0.050, "local": 0.020, "wire": 0.030, "messages": 1},
             "bucketed": {"step": 0.035, "local": 0.020, "wire": 0.030, "messages": 13}}
    lines = link_report(timed).splitlines()
    assert lines[0] == "bare model, no communication: step   20.00 ms"
    assert lines[2].startswith("BucketedDDP  step   35.00 ms, 13 message(s), 30.00 ms on the wire;")
    assert lines[2].endswith("; 15.00 ms shorter than FlatDDP's") and lines[1].endswith("on the wire")
    ax = plot_link_steps(timed, title="t")
    assert [round(b.get_height(), 6) for b in ax.patches] == [50.0, 35.0, 20.0, 20.0]
