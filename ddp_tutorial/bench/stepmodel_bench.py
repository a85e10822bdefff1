"""``bench stepmodel``: the step-time model predicted, then measured, on this machine (issue 39, "How fast, and why").

One launch of 2 gloo ranks (one thread each) measures the model's inputs and the steps they predict:
the achievable matmul rate and copy bandwidth (``performance.roofline``), an all-reduce at a few sizes fitted
as ``alpha + bytes / algbw`` (lesson 06's ``fit_alpha_beta``), then the median step (forward and backward, the
slowest rank's, after warm-up) of a ``DeepMLP`` under DDP, FSDP2, Megatron TP and a 2-stage GPipe pipeline.
``performance.this_machine`` turns the measured figures into a ``Hardware`` and each layout into FLOPs and
bytes, and predicts with ``stepmodel``'s rules. The ratios are this machine's figures, never asserted.

    python -m ddp_tutorial.bench stepmodel [--batch 256] [--steps 5] [--json PATH]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist

from ddp_tutorial.bench.collective_bw import allreduce_seconds, fit_alpha_beta, slowest
from ddp_tutorial.bench.common import Result
from ddp_tutorial.launch import spawn
from ddp_tutorial.models import DeepMLP
from ddp_tutorial.performance.hardware import Hardware
from ddp_tutorial.performance.roofline import copy_bandwidth, peak_matmul_rate
from ddp_tutorial.performance.stepmodel import predict
from ddp_tutorial.performance.this_machine import (
    LAYOUTS,
    capstone_step,
    cpu_hardware,
    layout_plan,
    link_from_fit,
    predict_plan,
)

HELP = "predicted vs measured step time of DDP, FSDP2, TP and a 2-stage pipeline on 2 gloo ranks"
SIZES = (1 << 12, 1 << 16, 1 << 20, 1 << 22)  # all-reduce bytes for the alpha-beta fit
MICRO = 4  # pipeline microbatches
IGNORED = ("wait_tensor", "_wrap_tensor_autograd")  # dispatcher ops that move nothing
KINDS = {"allreduce_": "all_reduce", "_allgather_base_": "all_gather", "all_gather_into_tensor": "all_gather",
         "_reduce_scatter_base_": "reduce_scatter", "reduce_scatter_tensor": "reduce_scatter", "recv_": "send"}


def rows_per_step(text: str) -> int:
    """An argparse ``type``: a batch that 2 ranks and ``MICRO`` microbatches split evenly."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
    if value < 2 * MICRO or value % (2 * MICRO):
        raise argparse.ArgumentTypeError(f"must be a positive multiple of {2 * MICRO} (2 ranks x {MICRO} "
                                         f"microbatches), got {value}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--batch", type=rows_per_step, default=256, help="rows per step, all ranks together")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per layout (the median counts)")
    parser.add_argument("--capstone-steps", type=int, default=2,
                        help="timed steps of each of lesson 22's layouts of 4 ranks (0: none)")


def make_step(layout: str, rank: int, world_size: int, batch: int):
    """The model under ``layout`` and a function running one forward and backward of this rank's share."""
    torch.manual_seed(0)
    model = DeepMLP()
    x = torch.randn(batch, 256, generator=torch.Generator().manual_seed(1))
    if layout in ("DDP", "FSDP2"):
        x = x.chunk(world_size)[rank]
    if layout == "DDP":
        from torch.nn.parallel import DistributedDataParallel

        model = DistributedDataParallel(model)
    elif layout in ("FSDP2", "TP"):
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh("cpu", (world_size,))
        if layout == "FSDP2":
            from torch.distributed.fsdp import fully_shard

            for layer in model.net:
                if isinstance(layer, torch.nn.Linear):
                    fully_shard(layer, mesh=mesh)
            fully_shard(model, mesh=mesh)
        else:
            from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

            parallelize_module(model, mesh, {"net.2": ColwiseParallel(), "net.4": RowwiseParallel(),
                                             "net.6": ColwiseParallel(), "net.8": RowwiseParallel()})
    elif layout == "PP":
        return pipeline_step(model, x, rank)

    def step() -> None:
        model.zero_grad(set_to_none=True)
        model(x).square().mean().backward()

    return step


def pipeline_step(model: DeepMLP, x: torch.Tensor, rank: int):
    """GPipe over 2 ranks: rank 0 runs the first three linears on every microbatch, rank 1 the rest."""
    stage = model.net[:6] if rank == 0 else model.net[6:]
    micro = x.chunk(MICRO)

    def step() -> None:
        stage.zero_grad(set_to_none=True)
        works = []
        if rank == 0:
            outs = [stage(m) for m in micro]
            works = [dist.isend(o.detach(), 1) for o in outs]
            for o in outs:
                grad = torch.empty_like(o)
                dist.recv(grad, 1)
                o.backward(grad)
        else:
            for m in micro:
                act = torch.empty(m.shape[0], 512)
                dist.recv(act, 0)
                act.requires_grad_(True)
                stage(act).square().mean().backward()
                works.append(dist.isend(act.grad, 0))
        for w in works:
            w.wait()

    return step


def recorded_traffic(rank: int, world_size: int, batch: int) -> dict[str, list[tuple[str, int]]]:
    """Worker: for each layout, (collective, bytes of its full buffer) of what one step hands to torch's
    dispatcher, on this rank; ``this_machine.layout_plan``'s formulas are held against it (a received
    message counts as ``send``: the plan counts what crosses the rank's link either way)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    seen: list[tuple[str, int]] = []

    class Recorder(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.__name__.split(".")[0]
            if func.namespace in ("_c10d_functional", "c10d") and name not in IGNORED:
                flat = [t for a in args for t in (a if isinstance(a, (list, tuple)) else [a])]
                seen.append((KINDS.get(name, name), max(t.nbytes for t in flat if isinstance(t, torch.Tensor))))
            return func(*args, **(kwargs or {}))

    out = {}
    for layout in LAYOUTS:
        step = make_step(layout, rank, world_size, batch)
        step()  # warm-up outside the recorder
        seen.clear()
        with Recorder():
            step()
        out[layout] = list(seen)
    return out


def machine_inputs() -> dict:
    """The model's inputs measured on these ranks as they run together: the slowest rank's matmul rate and
    copy bandwidth, and an all-reduce's seconds at each of ``SIZES``."""
    return {"rate": -slowest(-peak_matmul_rate((256, 512), repeat=3)), "copy": -slowest(-copy_bandwidth(1 << 22, repeat=3)),
            "allreduce": [allreduce_seconds(n) for n in SIZES]}


def hardware_of(got: dict) -> tuple[Hardware, float, float]:
    """``machine_inputs`` as a ``Hardware`` (gloo's all-reduce fitted, lesson 06), with the fit's alpha and algbw."""
    alpha, algbw = fit_alpha_beta(list(SIZES), got["allreduce"])
    latency, link = link_from_fit(alpha, algbw, got.get("ranks", 2))
    return cpu_hardware(matmul_flops=got["rate"], copy_bytes_per_s=got["copy"], latency_s=latency,
                        link_bytes_per_s=link), alpha, algbw


def capstone_times(rank: int, world_size: int, layouts: list[dict], steps: int) -> dict:
    """Worker: lesson 22's composed step on each layout of ``world_size`` ranks, the median of ``steps`` timed
    steps after a first (FSDP2's lazy init, the pipeline's setup), the slowest rank's; and this launch's inputs."""
    from ddp_tutorial.capstone.composed import build, train_steps
    from ddp_tutorial.capstone.reference import GPTRun

    got = machine_inputs() | {"ranks": world_size, "measured": []}
    for layout in layouts:
        parts = build(world_size, layout, GPTRun())
        train_steps(parts, range(1))
        times = []
        for i in range(1, steps + 1):
            dist.barrier()
            start = time.perf_counter()
            train_steps(parts, range(i, i + 1))
            times.append(slowest(time.perf_counter() - start))
        got["measured"].append(statistics.median(times))
    return got


def capstone_rows(steps: int) -> tuple[list[dict], str]:
    """The capstone's layouts of 4 ranks, predicted (``this_machine.capstone_step``) and measured, and a note
    on the inputs measured in that launch."""
    from ddp_tutorial.capstone.layout import Layout, layouts
    from ddp_tutorial.capstone.reference import GPTRun

    four = [vars(lay) for lay in layouts(4, **GPTRun().model_limits()) if lay.world_size == 4]
    got = spawn(capstone_times, 4, args=(four, steps), backend="gloo", threads=1, timeout=300, quiet=True)[0]
    hw, alpha, algbw = hardware_of(got)
    rows = []
    for layout, measured in zip(four, got["measured"]):
        shape, step_layout = capstone_step(layout)
        p = predict(shape, step_layout, hw)
        exposed = sum(p.exposed.values())
        rows.append({"layout": f"capstone {Layout(**layout)}", "ranks": 4, "GFLOPs": round(p.hardware_flops / p.gpus / 1e9, 4),
                     "comm MB": "-",
                     "compute ms": p.compute_s * 1e3, "comm exposed ms": exposed * 1e3, "bubble ms": p.bubble_s * 1e3,
                     "predicted ms": p.step_s * 1e3, "measured ms": measured * 1e3,
                     "predicted/measured": round(p.step_s / measured, 2)})
    note = (f"capstone (4 ranks sharing the cores, float64): inputs measured in that launch: matmul "
            f"{got['rate'] / 1e9:.3g} GFLOP/s per rank, all-reduce alpha {alpha * 1e6:.3g} us, algbw {algbw / 1e9:.3g} GB/s")
    return rows, note


def measure(rank: int, world_size: int, batch: int, steps: int) -> dict:
    """Worker: the model's inputs and each layout's median step, the slowest rank's."""
    got = machine_inputs()
    measured = {}
    for layout in LAYOUTS:
        step = make_step(layout, rank, world_size, batch)
        for _ in range(2):  # warm-up: buffers, connections, DTensor dispatch caches
            step()
        times = []
        for _ in range(steps):
            dist.barrier()
            start = time.perf_counter()
            step()
            times.append(slowest(time.perf_counter() - start))
        measured[layout] = statistics.median(times)
    return got | {"measured": measured}


def run(args: argparse.Namespace) -> Result:
    got = spawn(measure, 2, args=(args.batch, args.steps), backend="gloo", threads=1, timeout=300, quiet=True)[0]
    hw, alpha, algbw = hardware_of(got)
    sizes = [(m.in_features, m.out_features) for m in DeepMLP().net if isinstance(m, torch.nn.Linear)]
    rows = []
    for layout in LAYOUTS:
        plan = layout_plan(layout, sizes, args.batch, micro_batches=MICRO)
        p, measured = predict_plan(plan, hw), got["measured"][layout]
        rows.append({"layout": layout, "ranks": 2, "GFLOPs": round(plan.flops / 1e9, 3),
                     "comm MB": round(sum(c[1] for c in plan.comms) / 1e6, 2),
                     "compute ms": p.compute_s * 1e3, "comm exposed ms": p.exposed_s * 1e3,
                     "bubble ms": p.bubble_s * 1e3, "predicted ms": p.step_s * 1e3,
                     "measured ms": measured * 1e3, "predicted/measured": round(p.step_s / measured, 2)})
    ratios = [r["predicted/measured"] for r in rows]
    by_predicted = [r["layout"] for r in sorted(rows, key=lambda r: r["predicted ms"])]
    by_measured = [r["layout"] for r in sorted(rows, key=lambda r: r["measured ms"])]
    capstone, capstone_note = capstone_rows(args.capstone_steps) if args.capstone_steps else ([], "")
    low = [r["predicted/measured"] for r in capstone]
    return Result(
        name=f"stepmodel: DeepMLP, batch {args.batch}, 2 gloo ranks x 1 thread, predicted vs measured "
             f"(median of {args.steps} steps)",
        columns=["layout", "ranks", "GFLOPs", "comm MB", "compute ms", "comm exposed ms", "bubble ms",
                 "predicted ms", "measured ms", "predicted/measured"],
        rows=rows + capstone,
        notes=[f"inputs measured in this run: matmul {got['rate'] / 1e9:.3g} GFLOP/s (1 thread), copy "
               f"{got['copy'] / 1e9:.3g} GB/s, all-reduce alpha {alpha * 1e6:.3g} us, algbw {algbw / 1e9:.3g} GB/s",
               "GFLOPs and comm MB: the busiest rank's per step (performance.this_machine.layout_plan)",
               "left out: kernels other than matmuls (ReLU, the loss, gradient accumulation), per-call overheads "
               "(DDP and FSDP2 hooks, DTensor dispatch), small matmuls slower than the best square one, other load",
               f"fastest first, predicted: {' < '.join(by_predicted)}; measured: {' < '.join(by_measured)}",
               f"predicted/measured from {min(ratios):.2f} to {max(ratios):.2f} over {len(rows)} layouts "
               f"on 2 ranks"]
              + ([capstone_note, "capstone GFLOPs: the model's per rank (stepmodel.predict with "
                  "this_machine.capstone_step); left out as above, and the capstone's hundreds of small calls",
                  f"capstone predicted/measured from {min(low):.2f} to {max(low):.2f} over {len(capstone)} layouts "
                  f"of 4 ranks"] if capstone else []),
    )
