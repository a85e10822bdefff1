"""Lesson 11: a linear learning-rate warm-up, and DataLoader workers that change nothing but the time.

Covers ``ddp_tutorial.training.warmup``, ``ddp_tutorial.training.data``.
"""

from __future__ import annotations

import pytest
import torch
from torch.optim.lr_scheduler import LinearLR

from ddp_tutorial.training.data import DataSpec, SlowDataset, digits, make_loaders
from ddp_tutorial.training.warmup import accumulation_steps, linear_warmup, scaled_lr, warmup_factor


def _lrs(scheduler_for, steps: int, lr: float = 0.8) -> list[float]:
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=lr)
    scheduler = scheduler_for(optimizer)
    used = []
    for _ in range(steps):
        used.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return used


@pytest.mark.parametrize("warmup_steps", [1, 4, 10])
def test_linear_warmup_ramps_to_the_full_rate_and_stays(warmup_steps):
    used = _lrs(lambda opt: linear_warmup(opt, warmup_steps), 3 * warmup_steps)
    expected = [0.8 * min(1.0, (s + 1) / warmup_steps) for s in range(3 * warmup_steps)]
    assert used == pytest.approx(expected, rel=1e-12)
    assert used[warmup_steps - 1:] == pytest.approx([0.8] * (2 * warmup_steps + 1), rel=1e-12)


def test_linear_warmup_equals_torchs_linear_lr():
    ours = _lrs(lambda opt: linear_warmup(opt, 5), 12)
    torchs = _lrs(lambda opt: LinearLR(opt, start_factor=1 / 5, end_factor=1.0, total_iters=4), 12)
    assert ours == pytest.approx(torchs, rel=1e-12)


def test_no_warmup_is_the_full_rate():
    assert [warmup_factor(s, 0) for s in range(3)] == [1.0, 1.0, 1.0]


@pytest.mark.timeout(60)
def test_loader_workers_deliver_the_same_batches_in_the_same_order():
    spec = digits(0)
    slow = DataSpec(SlowDataset(spec.train, seconds=0.0), spec.test, 1, 8, 10)
    assert len(slow.train) == len(spec.train) and torch.equal(slow.train[5][0], spec.train[5][0])
    batches = {}
    for workers in (0, 2):
        train_loader, _ = make_loaders(slow, 64, rank=1, world_size=2, workers=workers)
        train_loader.sampler.set_epoch(3)
        batches[workers] = [y for _, y in train_loader]
    assert len(batches[0]) == len(batches[2]) > 0
    assert all(torch.equal(a, b) for a, b in zip(batches[0], batches[2]))


def test_scaled_lr_is_linear_for_sgd_and_square_root_for_adam():
    assert scaled_lr(0.1, 4) == pytest.approx(0.4)
    assert scaled_lr(1e-3, 4, "adam") == pytest.approx(2e-3)  # sqrt(4) = 2
    assert scaled_lr(1e-3, 1, "adam") == 1e-3
    with pytest.raises(ValueError, match="sgd"):
        scaled_lr(0.1, 2, "lamb")


def test_accumulation_keeps_the_global_batch_when_the_world_changes():
    for world_size in (1, 2, 4, 8):
        steps = accumulation_steps(256, 32, world_size)
        assert steps * 32 * world_size == 256  # the same samples per optimizer step
    assert accumulation_steps(256, 32, 8) == 1
    with pytest.raises(ValueError, match="multiple"):
        accumulation_steps(256, 48, 2)
