"""ddp_tutorial.data_parallel.mini_dp: DataParallel's four steps give the plain module's outputs and gradients."""

from __future__ import annotations

import threading

import pytest
import torch
from torch import nn

from ddp_tutorial.data_parallel.mini_dp import (
    MiniDataParallel,
    bytes_per_device,
    parallel_apply,
    phase_seconds,
    replicate,
    replicate_seconds,
    scatter,
    thread_speedup,
)
from ddp_tutorial.models import DeepMLP, SharedLayerNet, ToyModel

pytestmark = pytest.mark.timeout(60)
CPU2 = ["cpu", "cpu"]


def grads(module: nn.Module) -> list[torch.Tensor]:
    return [p.grad.clone() for p in module.parameters()]


def forward_backward(model: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    out = model(x)
    (out.pow(2).sum() + out.sum()).backward()
    return out.detach(), grads(model.module if isinstance(model, MiniDataParallel) else model)


@pytest.mark.parametrize("make", [ToyModel, lambda: DeepMLP(16, 32, 2, 3), lambda: SharedLayerNet().eval()])
@pytest.mark.parametrize("batch,replicas", [(8, 2), (7, 3), (2, 4), (1, 2), (12, 4)])
def test_same_outputs_and_grads_as_plain_module(make, batch, replicas):
    torch.manual_seed(0)
    model = make().double()
    in_features = next(model.parameters()).shape[1]
    x = torch.randn(batch, in_features, dtype=torch.float64)
    ref_out, ref_grads = forward_backward(model, x)
    out, dp_grads = forward_backward(MiniDataParallel(model, ["cpu"] * replicas), x)
    torch.testing.assert_close(out, ref_out, atol=1e-12, rtol=1e-12)
    for g, r in zip(dp_grads, ref_grads):
        torch.testing.assert_close(g, r, atol=1e-12, rtol=1e-12)


def test_training_steps_match_plain_module():
    torch.manual_seed(0)
    plain = ToyModel().double()
    wrapped = MiniDataParallel(ToyModel().double(), ["cpu"] * 3)
    wrapped.module.load_state_dict(plain.state_dict())
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (plain, wrapped)]
    g = torch.Generator().manual_seed(1)
    for _ in range(5):
        x, y = torch.randn(9, 10, generator=g, dtype=torch.float64), torch.randn(9, 5, generator=g, dtype=torch.float64)
        for model, opt in zip((plain, wrapped), opts):
            opt.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            opt.step()
    for a, b in zip(plain.parameters(), wrapped.module.parameters()):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-12)


def test_replicas_are_copies_that_feed_the_original():
    model = SharedLayerNet()
    replicas = replicate(model, CPU2)
    assert len(replicas) == 2 and replicas[0] is not replicas[1]
    for r in replicas:
        assert r.shared.weight is not model.shared.weight
        assert not r.shared.weight.is_leaf and r.shared.weight.grad_fn is not None
        torch.testing.assert_close(r.shared.weight, model.shared.weight)
        assert list(r.parameters()) == []  # copies are plain attributes, not Parameters
    assert replicas[0].norm.running_mean is model.norm.running_mean  # main device: the original buffer
    assert replicas[1].norm.running_mean is not model.norm.running_mean  # elsewhere: a copy
    # the original is untouched
    assert all(p.is_leaf for p in model.parameters())


def test_scatter_splits_along_dim0():
    x = torch.arange(14.0).reshape(7, 2)
    chunks = scatter(x, ["cpu"] * 3)
    assert [c.shape[0] for c in chunks] == [3, 3, 1]
    torch.testing.assert_close(torch.cat(chunks), x)


def test_parallel_apply_uses_threads_and_keeps_grad_mode():
    seen = []
    both_running = threading.Barrier(2, timeout=10)  # fails unless the replicas run at the same time

    class Record(nn.Module):
        def forward(self, x):
            seen.append(threading.get_ident())
            both_running.wait()
            return x * 2

    with torch.no_grad():
        outs = parallel_apply([Record(), Record()], [torch.ones(2, requires_grad=True)] * 2)
    assert len(set(seen)) == 2 and threading.get_ident() not in seen
    assert not any(o.requires_grad for o in outs)
    outs = parallel_apply([Record(), Record()], [torch.ones(2, requires_grad=True)] * 2)
    assert all(o.requires_grad for o in outs)


def test_parallel_apply_reraises_a_replica_error():
    class Boom(nn.Module):
        def forward(self, x):
            raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        parallel_apply([nn.Identity(), Boom()], [torch.ones(1), torch.ones(1)])


def test_batchnorm_statistics_are_per_chunk_in_training_mode():
    # A real DataParallel difference the lesson mentions: each replica normalises its own chunk.
    torch.manual_seed(0)
    model = SharedLayerNet().double().train()
    x = torch.randn(8, 8, dtype=torch.float64) * torch.linspace(0.1, 3, 8, dtype=torch.float64)[:, None]
    before = model.norm.running_mean.clone()
    assert not torch.allclose(MiniDataParallel(model, CPU2)(x), model(x))
    # only the main device's replica (the first chunk) updated the running statistics
    first_chunk_only = SharedLayerNet().double().train()
    first_chunk_only.load_state_dict({**model.state_dict(), "norm.running_mean": before,
                                      "norm.running_var": torch.ones(8, dtype=torch.float64),
                                      "norm.num_batches_tracked": torch.tensor(0)})
    first_chunk_only(x[:4])
    # model saw: DP forward (chunk 0 counted) then a plain forward of x
    reference = SharedLayerNet().double().train()
    reference.load_state_dict(first_chunk_only.state_dict())
    reference(x)
    torch.testing.assert_close(model.norm.running_mean, reference.norm.running_mean)
    assert int(model.norm.num_batches_tracked) == 2


def test_main_device_holds_the_most():
    rows = bytes_per_device(ToyModel(), torch.randn(18, 10), num_devices=3)
    totals = [sum(r.values()) for r in rows]
    assert len(rows) == 3 and totals[0] > totals[1] == totals[2]
    params = sum(p.numel() * 4 for p in ToyModel().parameters())
    assert rows[1]["replica weights + grads"] == 2 * params
    # device 0's replica is the master copy itself: only its gradients are extra
    assert rows[0]["replica grads"] == params and "replica weights + grads" not in rows[0]
    assert rows[0]["master weights, grads, optimizer"] == 4 * params  # Adam: 2 states per parameter


def test_default_devices_every_gpu_else_two_cpu_devices_that_really_split_the_batch(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 3)
    assert MiniDataParallel(ToyModel()).devices == [torch.device(f"cuda:{i}") for i in range(3)]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    model = ToyModel().double()
    wrapped = MiniDataParallel(model)
    assert wrapped.devices == [torch.device("cpu")] * 2
    seen = []  # the replicas share the original's hooks: one call per chunk
    model.register_forward_hook(lambda module, inputs, output: seen.append(tuple(inputs[0].shape)))
    x = torch.randn(7, 10, dtype=torch.float64)
    out = wrapped(x)
    assert sorted(seen, reverse=True) == [(4, 10), (3, 10)]  # two threads: in either order
    seen.clear()
    torch.testing.assert_close(out, model(x), atol=1e-12, rtol=1e-12)
    assert seen == [(7, 10)]


def test_cost_probes_return_times_for_every_phase():
    phases = phase_seconds(ToyModel(), torch.randn(16, 10), CPU2, repeat=2)
    assert list(phases) == ["scatter", "replicate", "parallel_apply", "gather", "backward + reduce"]
    assert all(0 < s < 10 for s in phases.values())
    assert 0 < replicate_seconds(ToyModel(), repeat=2) < 10
    assert 0 < thread_speedup(ToyModel(), torch.randn(8, 10), repeat=2) < 100


