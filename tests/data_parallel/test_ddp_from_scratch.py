"""NaiveDDP, FlatDDP and BucketedDDP against torch DDP and against gradients averaged by hand.

Covers ``ddp_tutorial.data_parallel.ddp_from_scratch``, ``ddp_tutorial.data_parallel.buckets``,
``ddp_tutorial.models``.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from ddp_tutorial.bench.ddp import wrap
from ddp_tutorial.data_parallel.buckets import fit_overhead_model, study_report
from ddp_tutorial.data_parallel.ddp_from_scratch import WRAPPERS, assign_buckets, compare_with_torch_ddp
from ddp_tutorial.data_parallel.overlap import timeline
from ddp_tutorial.launch import spawn
from ddp_tutorial.models import make_model

TOL = 1e-6


MODELS = ("toy", "shared", "mlp")  # shared: one layer used twice, and BatchNorm buffers


def compare_every_model(rank: int, world_size: int) -> dict:
    # One launch for all models keeps the test short.
    # A 2 KB bucket cap splits even these small models into several buckets.
    return {m: compare_with_torch_ddp(rank, world_size, m, num_steps=5, bucket_cap_mb=0.002) for m in MODELS}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world_size", [2, 3])
def test_equal_to_torch_ddp_after_several_steps(world_size):
    results = spawn(compare_every_model, world_size, timeout=100)
    for rank, per_model in enumerate(results):
        assert set(per_model) == set(MODELS)
        for model_name, diffs in per_model.items():
            assert set(diffs) == {"naive", "flat", "bucketed"}
            for kind, diff in diffs.items():
                assert diff <= TOL, (rank, model_name, kind, diff)


class _Unused(nn.Module):
    """``spare`` gets no gradient: the wrappers must still finish (zeros) instead of hanging."""

    def __init__(self):
        super().__init__()
        self.used = nn.Linear(4, 3)
        self.spare = nn.Linear(4, 3)

    def forward(self, x):
        return self.used(x)


def grads_against_hand_average(rank: int, world_size: int, kind: str, model_name: str) -> dict:
    """After backward, each ``param.grad`` must be the mean of the ranks' local gradients."""
    if model_name == "unused":
        torch.manual_seed(rank)
        model, (n_in, n_out) = _Unused().double(), (4, 3)
    else:
        model, (n_in, n_out) = make_model(model_name, seed=rank, dtype=torch.float64)
    plain = [p.detach().clone() for p in model.parameters()]
    wrapped = WRAPPERS[kind](model, **({"bucket_cap_mb": 0.001} if kind == "bucketed" else {}))
    # The broadcast at construction: every rank now holds rank 0's weights.
    rank0 = [p.detach().clone() for p in model.parameters()]
    for p in rank0:
        dist.broadcast(p, 0)
    same_as_rank0 = all(torch.equal(a, b) for a, b in zip(model.parameters(), rank0))
    changed = any(not torch.equal(a, b) for a, b in zip(model.parameters(), plain))
    # Reference: local gradients of an undistributed copy, averaged with all_gather.
    twin = make_model(model_name, 0, torch.float64)[0] if model_name != "unused" else _Unused().double()
    twin.load_state_dict(model.state_dict())
    x = torch.randn(6, n_in, generator=torch.Generator().manual_seed(rank), dtype=torch.float64)
    twin(x).square().mean().backward()
    expected = []
    for p in twin.parameters():
        local = p.grad if p.grad is not None else torch.zeros_like(p)
        parts = [torch.empty_like(local) for _ in range(world_size)]
        dist.all_gather(parts, local)
        expected.append(torch.stack(parts).mean(0))
    wrapped(x).square().mean().backward()
    diff = max((p.grad - e).abs().max().item() for p, e in zip(model.parameters(), expected))
    return {"same_as_rank0": same_as_rank0, "changed": changed, "diff": diff}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["naive", "flat", "bucketed"])
@pytest.mark.parametrize("model_name", ["shared", "unused"])
def test_grads_are_the_mean_over_ranks(kind, model_name):
    results = spawn(grads_against_hand_average, 3, args=(kind, model_name), timeout=90)
    for rank, r in enumerate(results):
        assert r["same_as_rank0"], rank
        assert r["diff"] <= TOL, (rank, r["diff"])
    assert not results[0]["changed"]  # rank 0 keeps its own weights...
    assert results[1]["changed"] and results[2]["changed"]  # ...the others receive them


def planted_buffers(rank: int) -> dict[str, torch.Tensor]:
    """What rank ``rank`` writes into its BatchNorm's buffers before wrapping (rank 0 too, so
    that rank 0's values are not just BatchNorm's defaults)."""
    return {"running_mean": torch.full((8,), float(rank)) + torch.arange(8.0) * (rank == 0),
            "running_var": torch.full((8,), float(rank + 1)),
            "num_batches_tracked": torch.tensor(rank if rank else 7)}


def buffers_after_wrapping(rank: int, world_size: int) -> dict:
    """Each wrapper (and torch DDP) around a model whose BatchNorm buffers differ per rank: every
    rank's buffers, gathered right after construction, before any forward."""
    out = {}
    for kind in ("torch", *WRAPPERS):
        model, _ = make_model("shared", seed=rank)
        with torch.no_grad():
            for name, value in planted_buffers(rank).items():
                getattr(model.norm, name).copy_(value)
        wrapped = nn.parallel.DistributedDataParallel(model) if kind == "torch" else WRAPPERS[kind](model)
        gathered = {}
        for name, buf in wrapped.module.norm.named_buffers():
            parts = [torch.empty_like(buf) for _ in range(world_size)]
            dist.all_gather(parts, buf)
            gathered[name] = parts
        out[kind] = gathered
    return out


@pytest.mark.timeout(60)
def test_construction_broadcasts_rank0_buffers():
    results = spawn(buffers_after_wrapping, 3, timeout=45)
    want = planted_buffers(0)
    for kind, gathered in results[0].items():
        assert set(gathered) == set(want), kind
        for name, parts in gathered.items():
            for rank, got in enumerate(parts):
                assert got.dtype == want[name].dtype and torch.equal(got, want[name]), (kind, name, rank, got)
    assert set(results[0]) == {"torch", *WRAPPERS}


def test_bucket_assignment():
    params = [torch.zeros(n) for n in (1000, 10, 1000, 10, 300_000, 10)]  # float32: 4 bytes each
    # Reverse order; a bucket closes when the next parameter would pass the cap.
    assert assign_buckets(params, bucket_cap_mb=8080 / 2**20) == [[5], [4], [3, 2, 1, 0]]
    assert assign_buckets(params, bucket_cap_mb=8000 / 2**20) == [[5], [4], [3, 2, 1], [0]]
    assert assign_buckets(params, bucket_cap_mb=25) == [[5, 4, 3, 2, 1, 0]]
    mixed = [torch.zeros(3, dtype=torch.float64), torch.zeros(3), torch.zeros(3)]
    assert assign_buckets(mixed, 25) == [[2, 1], [0]]  # one dtype per flat bucket


def test_fit_overhead_model_recovers_latency_and_bandwidth():
    latency, bandwidth = 50e-6, 2e9
    calls = [1, 1, 1, 1, 4, 16, 64]
    nbytes = [1e3, 1e5, 1e6, 4e6, 4e6, 4e6, 4e6]
    seconds = [c * latency + b / bandwidth for c, b in zip(calls, nbytes)]
    fit_latency, fit_bandwidth = fit_overhead_model(calls, nbytes, seconds)
    assert fit_latency == pytest.approx(latency, rel=1e-6)
    assert fit_bandwidth == pytest.approx(bandwidth, rel=1e-6)


@pytest.mark.timeout(120)
def test_bucketed_communication_starts_during_backward():
    r = spawn(timeline, 2, args=(0.5,), timeout=90)[0]
    events = r["events"]
    ready = [t for kind, _, t in events if kind == "ready"]
    launches = {i: t for kind, i, t in events if kind == "launch"}
    done = {i: t for kind, i, t in events if kind == "done"}
    assert len(r["buckets"]) > 2 and len(launches) == len(done) == len(r["buckets"])
    assert sorted(i for b in r["buckets"] for i in b) == list(range(len(ready)))
    assert launches[0] < max(ready)  # the first bucket is on the wire before the last gradient exists
    assert all(launches[b] <= done[b] for b in launches)
    assert [launches[b] for b in sorted(launches)] == sorted(launches.values())  # buckets go in order


def test_first_bucket_is_small_like_torch_ddp():
    params = [torch.zeros(n) for n in (200_000, 200_000, 200_000, 10)]  # 0.8 MB each
    assert assign_buckets(params, 25) == [[3, 2, 1, 0]]
    assert assign_buckets(params, 25, first_bucket_mb=1.0) == [[3, 2], [1, 0]]


def test_fit_overhead_model_never_returns_negative_constants():
    # Noisy data whose best unconstrained line has a negative intercept.
    latency, bandwidth = fit_overhead_model([1, 1, 1], [1e3, 1e6, 2e6], [1e-6, 2e-3, 4.5e-3])
    assert latency == 0.0 and bandwidth > 0
    latency, bandwidth = fit_overhead_model([1, 2, 4], [1e6, 1e6, 1e6], [1e-3, 2e-3, 4e-3])
    assert latency == pytest.approx(1e-3) and bandwidth > 0


def rank0_evaluates_alone(rank: int, world_size: int, kind: str) -> bool:
    model, (n_in, _) = make_model("shared", seed=0)
    wrapped = WRAPPERS[kind](model)
    if rank == 0:  # a common pattern: only rank 0 evaluates; no collective may be waiting for the others
        wrapped.eval()
        with torch.no_grad():
            wrapped(torch.randn(4, n_in))
    dist.barrier()
    return True


@pytest.mark.timeout(120)
def test_no_buffer_broadcast_under_no_grad():
    # The buffer broadcast lives in the shared base class: one wrapper is enough.
    assert spawn(rank0_evaluates_alone, 2, args=("bucketed",), timeout=30) == [True, True]


def test_fit_overhead_model_is_not_thrown_by_one_slow_point():
    latency, bandwidth = 50e-6, 2e9
    calls = [1, 1, 1, 1, 1, 1, 1, 30, 27, 5, 2, 2]  # single all-reduces, then bucketings
    nbytes = [1e3, 4e3, 16e3, 64e3, 256e3, 1e6, 4e6] + [3.69e6] * 5
    seconds = [c * latency + b / bandwidth for c, b in zip(calls, nbytes)]
    seconds[7] *= 10  # one measurement disturbed by another program
    fit_latency, fit_bandwidth = fit_overhead_model(calls, nbytes, seconds)
    assert fit_latency == pytest.approx(latency, rel=0.1)
    assert fit_bandwidth == pytest.approx(bandwidth, rel=0.1)


def record_buckets(state, bucket):  # no annotations: DDP checks them and our future-import makes strings
    """A DDP communication hook (public API): notes each bucket's parameter indices and bytes, then all-reduces."""
    index = {id(p): i for i, p in enumerate(state["params"])}
    state["seen"].append((bucket.index(), [index[id(p)] for p in bucket.parameters()],
                          bucket.buffer().numel() * bucket.buffer().element_size()))
    return default_hooks.allreduce_hook(None, bucket)


def bucket_layouts(rank: int, world_size: int) -> dict:
    """Torch DDP's real buckets, as its communication hook receives them once it has rebuilt them,
    and ours, for the benchmark's two configurations. Each bucket: (parameter indices, bytes)."""
    model, (n_in, _) = make_model("big", seed=0)
    sizes = [p.numel() * p.element_size() for p in model.parameters()]
    out = {"param_bytes": sizes}
    for cap in (None, 25.0):
        torch_ddp, ours = wrap("torch", copy.deepcopy(model), cap), wrap("bucketed", copy.deepcopy(model), cap)
        state: dict = {"params": list(torch_ddp.module.parameters()), "seen": []}
        torch_ddp.register_comm_hook(state, record_buckets)
        # Torch starts with one bucket, records the order gradients become ready in iteration 1,
        # and rebuilds its buckets in that order at the start of iteration 2; from then on every
        # iteration hands the hook the same buckets. (Torch's logger reports them too, through
        # the private DistributedDataParallel._get_ddp_logging_data: the hook is public.)
        layouts = []
        for _ in range(3):
            state["seen"] = []
            torch_ddp(torch.randn(4, n_in)).square().mean().backward()
            layouts.append([(indices, nbytes) for _, indices, nbytes in sorted(state["seen"])])
        assert layouts[1] == layouts[2], "torch's buckets still changed after its rebuild"
        ours_bytes = [sum(sizes[i] for i in b) for b in ours.buckets]
        out[cap] = {"torch": layouts[2], "ours": list(zip(ours.buckets, ours_bytes)),
                    "torch_cap": torch_ddp.bucket_bytes_cap}
    return out


@pytest.mark.timeout(60)
def test_benchmark_buckets_against_torch_ddps_rebuilt_buckets():
    layouts = spawn(bucket_layouts, 2, timeout=50)[0]
    sizes = layouts["param_bytes"]
    backward = list(reversed(range(len(sizes))))  # the order gradients become ready in this MLP
    assert 2**20 < sum(sizes) < 25 * 2**20  # 3.5 MB of gradients: more than 1 MB, less than 25 MB

    # An explicit 25 MB: also the first bucket's cap, in both; everything fits in one bucket.
    assert layouts[25.0]["torch_cap"] == 25 * 2**20
    assert layouts[25.0]["torch"] == layouts[25.0]["ours"] == [(backward, sum(sizes))]

    # Default: 25 MB with a 1 MB first bucket (torch's _DEFAULT_FIRST_BUCKET_BYTES), in both: two
    # buckets, the first one ~1 MB, in backward order. The first bucket's edge differs by one
    # parameter: torch closes a bucket once it has *reached* its cap (adding the parameter that
    # crosses it; see compute_bucket_assignment_by_size in torch's reducer), ours before the next
    # parameter would *pass* it, so torch's first bucket is just over 1 MiB and ours just under.
    assert dist._DEFAULT_FIRST_BUCKET_BYTES == 2**20
    assert layouts[None]["torch_cap"] == 25 * 2**20
    torch_layout, ours_layout = layouts[None]["torch"], layouts[None]["ours"]
    assert len(torch_layout) == len(ours_layout) == 2
    assert [i for b, _ in torch_layout for i in b] == [i for b, _ in ours_layout for i in b] == backward
    for layout in (torch_layout, ours_layout):
        assert [n for _, n in layout] == [sum(sizes[i] for i in b) for b, _ in layout]  # bytes = its parameters'
    cumulative = [sum(sizes[i] for i in backward[:k + 1]) for k in range(len(backward))]
    reach = next(k for k, c in enumerate(cumulative) if c >= 2**20) + 1  # shortest prefix reaching 1 MiB
    assert torch_layout[0][0] == backward[:reach]
    assert ours_layout[0][0] == backward[:reach - 1] and cumulative[reach - 2] <= 2**20


def unused_parameter_after_a_step(rank: int, world_size: int) -> dict:
    """``spare`` is used by no rank; after one SGD step with weight decay: did it move, per wrapper?"""
    out = {}
    for kind in ("torch", *WRAPPERS):
        torch.manual_seed(0)
        model = _Unused().double()
        before = model.spare.weight.detach().clone()
        wrapped = (nn.parallel.DistributedDataParallel(model, find_unused_parameters=True) if kind == "torch"
                   else WRAPPERS[kind](model))
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=0.1)
        wrapped(torch.ones(2, 4, dtype=torch.float64)).sum().backward()
        opt.step()
        out[kind] = (model.spare.weight.grad is None, not torch.equal(model.spare.weight, before))
    return out


@pytest.mark.timeout(60)
def test_a_zero_gradient_lets_weight_decay_move_an_unused_parameter_unlike_torch_ddp():
    for per_kind in spawn(unused_parameter_after_a_step, 2, timeout=45):
        assert per_kind["torch"] == (True, False)  # torch DDP leaves .grad None: the optimizer skips it
        for kind in WRAPPERS:  # ours fill in zeros: weight decay (and momentum) still move it
            assert per_kind[kind] == (False, True), kind


def test_study_report_prints_the_fit_and_the_noise_between_equal_bucketings():
    rows = [{"bucket_cap_mb": 1.0, "buckets": 5, "bytes": 100, "step": 0.010, "comm": 0.002},
            {"bucket_cap_mb": 4.0, "buckets": 2, "bytes": 100, "step": 0.008, "comm": 0.001},
            {"bucket_cap_mb": 25.0, "buckets": 2, "bytes": 100, "step": 0.010, "comm": 0.001}]
    lines = study_report({"rows": rows, "latency": 2e-4, "bandwidth": 2e9}).splitlines()
    assert lines[0] == "fitted: latency 200 us per all-reduce, bandwidth 2.00 GB/s"
    assert len(lines) == 5 and "5 buckets, step  10.00 ms" in lines[1]
    assert lines[-1].startswith("caps 4 and 25 MB") and lines[-1].endswith("differ by 25% (the noise)")
