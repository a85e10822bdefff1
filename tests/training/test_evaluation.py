"""Lesson 11: evaluation on every rank, rank 0 alone, DistributedSampler's padding, DDP's ``module.`` prefix."""

from __future__ import annotations

import pytest
import torch
from torch.nn.modules.utils import consume_prefix_in_state_dict_if_present
from torch.utils.data import DataLoader, Subset

from ddp_tutorial.launch import spawn
from ddp_tutorial.models import build_model
from ddp_tutorial.training.data import digits
from ddp_tutorial.training.evaluation import (
    as_metrics,
    evaluation_worker,
    rank0_calls_a_collective,
    score,
    state_dicts_worker,
)


def _one_process(indices=None, seed: int = 0) -> torch.Tensor:
    """The reference, computed another way: one process, no group, scoring (part of) the test split."""
    test = digits(seed).test
    torch.manual_seed(seed)
    model = build_model("cnn", 1, 10)
    part = test if indices is None else Subset(test, indices)
    return score(model, DataLoader(part, batch_size=512), torch.device("cpu"))


def _close(a: dict, b: dict) -> bool:
    return (a["test_samples"], a["test_acc"]) == (b["test_samples"], b["test_acc"]) and \
        a["test_loss"] == pytest.approx(b["test_loss"], rel=1e-6)


@pytest.mark.timeout(120)
def test_every_way_of_evaluating_against_one_process_scoring_everything():
    results = spawn(evaluation_worker, 2, backend="gloo", timeout=90, quiet=True)  # CPU: exact comparison
    n = len(digits(0).test)  # 359: not a multiple of 2
    reference = _one_process()
    truth = as_metrics(reference)
    assert truth["test_samples"] == n
    for way in results[0]:  # every rank received the same numbers, whichever way
        assert results[0][way]["metrics"] == results[1][way]["metrics"], way
    got = {way: r["metrics"] for way, r in results[0].items()}
    scored = {way: [r[way]["scored"] for r in results] for way in results[0]}
    # every rank scores its unpadded shard and the sums are all-reduced: one process's numbers
    assert _close(got["every rank its shard, all_reduce"], truth)
    assert scored["every rank its shard, all_reduce"] == [180, 179]
    # rank 0 alone: the same numbers, all the work on rank 0
    assert _close(got["rank 0 everything, broadcast"], truth)
    assert scored["rank 0 everything, broadcast"] == [n, 0]
    # the padded sampler counts sample 0 twice: the truth plus sample 0 once more
    assert scored["DistributedSampler(drop_last=False)"] == [180, 180]
    assert _close(got["DistributedSampler(drop_last=False)"], as_metrics(reference + _one_process([0])))
    # drop_last=True leaves the last sample out
    assert scored["DistributedSampler(drop_last=True)"] == [179, 179]
    assert _close(got["DistributedSampler(drop_last=True)"], as_metrics(_one_process(list(range(n - 1)))))


@pytest.mark.timeout(120)
def test_trained_weights_are_scored_like_one_process():
    torch.manual_seed(1)
    weights = {k: v + 0.01 * torch.randn_like(v) for k, v in build_model("cnn", 1, 10).state_dict().items()}
    results = spawn(evaluation_worker, 2, args=(weights,), backend="gloo", timeout=90, quiet=True)
    model = build_model("cnn", 1, 10)
    model.load_state_dict(weights)
    truth = as_metrics(score(model, DataLoader(digits(0).test, batch_size=512), torch.device("cpu")))
    assert _close(results[1]["every rank its shard, all_reduce"]["metrics"], truth)


@pytest.mark.timeout(60)
def test_rank0_alone_in_a_collective_hangs_until_the_timeout():
    outcome = spawn(rank0_calls_a_collective, 2, args=(2.0,), backend="gloo", timeout=45, quiet=True)
    assert outcome == ["stuck in evaluate's all_reduce until the group's timeout",
                       "stuck in the barrier, waiting for rank 0 until the group's timeout"]


@pytest.mark.timeout(90)
def test_ddp_state_dict_has_the_module_prefix_and_consume_prefix_fixes_loading():
    states = spawn(state_dicts_worker, 2, timeout=60, quiet=True)
    wrapped, bare = states[0]["ddp.state_dict()"], states[0]["ddp.module.state_dict()"]
    assert list(wrapped) == [f"module.{k}" for k in bare]
    assert all(torch.equal(wrapped[f"module.{k}"], v) for k, v in bare.items())
    assert all(torch.equal(states[1]["ddp.module.state_dict()"][k], v) for k, v in bare.items())  # DDP broadcast
    model = build_model("cnn", 1, 10)
    with pytest.raises(RuntimeError, match='Unexpected key\\(s\\) in state_dict: "module.'):
        model.load_state_dict(wrapped)
    consume_prefix_in_state_dict_if_present(wrapped, "module.")
    model.load_state_dict(wrapped)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in bare.items())
