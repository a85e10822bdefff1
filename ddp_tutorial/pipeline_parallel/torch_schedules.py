"""torch's pipeline schedules on ``PipelineStage``s, each run timed per action (``19_pipeline_schedules``).

``torch.distributed.pipelining`` runs the same model with any of its seven schedules: a rank
holds one stage (``ScheduleGPipe``, ``Schedule1F1B``) or several (``ScheduleInterleaved1F1B``,
``ScheduleInterleavedZeroBubble``, ``ScheduleLoopedBFS``: stages ``r, r + p, ...``;
``ScheduleZBVZeroBubble``, ``ScheduleDualPipeV``: stages ``r`` and ``2p - 1 - r``, a V). The zero-bubble schedules split each backward into ``B``
(the input gradient, which the previous stage waits for) and ``W`` (the weight gradient,
which nobody waits for, so it fills the bubbles). The stages' ``forward_one_chunk``,
``backward_one_chunk`` and ``backward_weight_one_chunk`` are wrapped to record when each
ran: the timeline is the run's own. Every schedule is checked against one process.
``torch_orders`` and ``ideal_run`` play torch's own order of a schedule on the ideal clock of
``orders.simulate``: the schedule's own target.

    torchrun --nproc-per-node=2 -m ddp_tutorial.pipeline_parallel.torch_schedules
    torchrun --nproc-per-node=4 -m ddp_tutorial.pipeline_parallel.torch_schedules --num-micro 8
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from functools import wraps
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed import pipelining

from ddp_tutorial.doctor import older_than
from ddp_tutorial.env import distributed, rank_device, rank_info
from ddp_tutorial.pipeline_parallel.model_parallel import toy_batch
from ddp_tutorial.pipeline_parallel.one_f_one_b import (
    ORDERS,
    OUT_FEATURES,
    WIDTH,
    Recorder,
    build_layers,
    global_grads,
    max_difference,
    one_process,
    stage_module,
)
from ddp_tutorial.pipeline_parallel.orders import Event, Step, peak_in_flight, simulate

__all__ = ["SCHEDULES", "ZERO_BUBBLE", "V_SHAPED", "IDEAL", "runs_here", "stage_indices", "stage_delays", "torch_orders",
           "ideal_run", "record_stage", "same_dtype_handshake", "schedule_worker", "schedule_runs"]

# name -> (torch's class, stages per rank, placement): the whole model has 2 layers per rank,
# one stage of 2 layers per rank, or 2 stages of one layer each.
SCHEDULES = {
    "GPipe": ("ScheduleGPipe", 1, "loop"),
    "1F1B": ("Schedule1F1B", 1, "loop"),
    "Interleaved1F1B": ("ScheduleInterleaved1F1B", 2, "loop"),
    "InterleavedZeroBubble": ("ScheduleInterleavedZeroBubble", 2, "loop"),
    "ZBVZeroBubble": ("ScheduleZBVZeroBubble", 2, "v"),
    "LoopedBFS": ("ScheduleLoopedBFS", 2, "loop"),
    "DualPipeV": ("ScheduleDualPipeV", 2, "v"),
}

ZERO_BUBBLE = ("InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV")  # backward split into B (input) and W (weights)
V_SHAPED = ("ZBVZeroBubble", "DualPipeV")


def runs_here(schedule: str, backend: str, version: str = torch.__version__) -> bool:
    """False where ``schedule`` is known to fail: the V schedules on gloo before torch 2.14.

    ``ScheduleZBVZeroBubble``: 2.9 and 2.10 run the V through their older multi-stage loop, which
    sends a stage's output to the next stage even when both sit on one rank; gloo cannot send to
    itself ("Pair is not connected"). ``ScheduleDualPipeV`` on 2.9.1 with gloo runs to the end
    with gradients 0.1 away from one process's. 2.14 and 2.15 run both through the action
    runtime, which hands the tensor over in memory. 2.9, 2.10, 2.14 and 2.15 were tried;
    2.11-2.13 are treated as failing until tried.
    """
    return not (schedule in V_SHAPED and backend == "gloo" and older_than(version, "2.14"))


def stage_delays(schedule: str, delays: dict[str, float] | None) -> dict[str, float] | None:
    """The simulated compute of one action: ``delays`` are a whole rank's ``F`` and ``B`` (2 layers);
    a stage of one layer takes half, and a split backward gives half of ``B`` to ``W``."""
    if not delays:
        return None
    per_rank = SCHEDULES[schedule][1]
    f, b = delays["F"] / per_rank, delays["B"] / per_rank
    return {"F": f, "B": b / 2, "W": b / 2} if schedule in ZERO_BUBBLE else {"F": f, "B": b}


# the ideal clock of one stage (half a rank's layers): F = 1, a full backward 2, its halves 1 each
IDEAL = {"F": 1.0, "B": 2.0, "I": 1.0, "W": 1.0}
KINDS = {"FORWARD": "F", "FULL_BACKWARD": "B", "BACKWARD_INPUT": "I", "BACKWARD_WEIGHT": "W"}


def torch_orders(schedule: str, num_ranks: int, num_micro: int) -> list[list[Step]] | None:
    """torch's own action list for ``schedule``, per rank, as ``(stage, kind, micro)`` steps.

    Read with ``torch.distributed.pipelining._schedule_visualizer.get_schedule_ops``, a private
    helper (there in torch 2.9 to 2.15): None on a release without it. DualPipeV's overlapped
    ``(F; B)`` pairs count as their F and then their B; communication and gradient-reduction
    actions are left out (messages take no time on the ideal clock).
    """
    try:
        from torch.distributed.pipelining._schedule_visualizer import get_schedule_ops
    except ImportError:
        return None
    cls_name, per_rank, _ = SCHEDULES[schedule]
    ops = get_schedule_ops(getattr(pipelining, cls_name), num_ranks, num_micro, per_rank)
    return [[(a.stage_index, KINDS[a.computation_type.name], a.microbatch_index)
             for action in rank_ops if action is not None
             for a in (getattr(action, "sub_actions", None) or (action,))
             if a.computation_type.name in KINDS] for rank_ops in ops]  # compute only: no REDUCE_GRAD, SEND, ...


def ideal_run(schedule: str, num_ranks: int, num_micro: int) -> list[Event] | None:
    """``schedule``'s order on the lesson's ideal clock (``orders.simulate`` with ``IDEAL``): the
    timeline it is built for, its idle share its own target. GPipe and 1F1B run the lesson's
    orders (section 1), the others torch's (``torch_orders``; None where this torch cannot say)."""
    if SCHEDULES[schedule][1] == 1:
        return simulate([ORDERS[schedule.lower()](r, num_ranks, num_micro) for r in range(num_ranks)], IDEAL)
    steps = torch_orders(schedule, num_ranks, num_micro)
    return None if steps is None else simulate(steps, IDEAL)


def stage_indices(rank: int, num_ranks: int, per_rank: int, placement: str = "loop") -> list[int]:
    """The stages rank ``rank`` holds: ``loop`` deals them round-robin (``r, r + p, ...``); ``v``
    goes down and back up (``r`` and ``2p - 1 - r``), so the first and last stage share rank 0."""
    if placement == "v":
        if per_rank != 2:
            raise ValueError(f"the V placement needs 2 stages per rank, got {per_rank}")
        return [rank, 2 * num_ranks - 1 - rank]
    return [rank + k * num_ranks for k in range(per_rank)]


def record_stage(stage: pipelining.PipelineStage, recorder: Recorder) -> None:
    """Wrap the stage's three compute calls so that each is timed in ``recorder`` (F, B, W)."""
    index = stage.stage_index

    def timed(name: str, kind_of: Callable[[dict], str]) -> None:  # kind_of: the call's kwargs -> F, B or W
        original = getattr(stage, name)

        @wraps(original)
        def call(chunk: int, *args: Any, **kwargs: Any) -> Any:
            with recorder.action(index, kind_of(kwargs), chunk):
                return original(chunk, *args, **kwargs)
        setattr(stage, name, call)

    timed("forward_one_chunk", lambda kwargs: "F")
    timed("backward_one_chunk", lambda kwargs: "B")
    timed("backward_weight_one_chunk", lambda kwargs: "W")


def same_dtype_handshake(stage: pipelining.PipelineStage) -> None:
    """torch 2.9 only: make the stage's first-step handshake send the float32 its neighbour receives.

    2.9 opens each link with an int64 scalar sent into a one-element float32 buffer; NCCL lets it
    pass, gloo aborts the process ("Received data size doesn't match expected size. 8 vs 4"), so
    every schedule of 2.9 dies on a CPU. Fixed in torch 2.10 (pytorch#165539). With the V placement
    2.9 also opens a link from the middle rank to itself, which gloo refuses ("Pair is not
    connected"): those handshakes are dropped (the stages on one rank pass tensors in memory).
    """
    original = stage._get_init_p2p_neighbors_ops

    def ops() -> list[dist.P2POp]:
        fixed = [op for op in original() if op.group_peer != stage.group_rank]  # the V's turn: no self-sends
        for op in fixed:
            if op.op is dist.isend:
                op.tensor = torch.zeros(1, device=op.tensor.device)
        return fixed
    stage._get_init_p2p_neighbors_ops = ops


def schedule_worker(rank: int, world_size: int, schedule: str = "1F1B", num_micro: int = 4,
                    micro_rows: int = 2, seed: int = 0, delays: dict[str, float] | None = None) -> dict:
    """Run ``schedule`` on ``world_size`` ranks over ``num_micro`` micro-batches, the second step timed.

    Raises ``RuntimeError`` up front where ``runs_here`` says the schedule fails (no hang, no abort).
    The first step builds the stages' buffers (shapes are inferred from the first micro-batch);
    its gradients are zeroed. Returns the rank's stages, timeline, peak of micro-batches held,
    the global loss (the rank with the last stage) and its gradients under the whole model's names.
    """
    cls_name, per_rank, placement = SCHEDULES[schedule]
    if not runs_here(schedule, dist.get_backend()):
        raise RuntimeError(f"{cls_name} fails on torch {torch.__version__} with {dist.get_backend()} "
                           "(see torch_schedules.runs_here); the newest torch runs it")
    device = rank_device()
    num_stages = per_rank * world_size
    layers = build_layers(2 * world_size, seed)
    mine = stage_indices(rank, world_size, per_rank, placement)
    modules = {s: stage_module(layers, s, num_stages) for s in mine}
    stages = [pipelining.PipelineStage(modules[s][0].to(device), s, num_stages, device) for s in mine]
    loss_fn = nn.functional.mse_loss  # mean per micro-batch; the schedule divides the gradients by m
    cls = getattr(pipelining, cls_name)
    runner = cls(stages[0] if per_rank == 1 else stages, num_micro, loss_fn=loss_fn)
    x, y = toy_batch(0, num_micro * micro_rows, seed, WIDTH, OUT_FEATURES)
    has_first, has_last = 0 in mine, num_stages - 1 in mine
    inputs = (x.to(device),) if has_first else ()
    recorder = Recorder(rank, stage_delays(schedule, delays), device)
    for stage in stages:
        record_stage(stage, recorder)
        if older_than(torch.__version__, "2.10"):
            same_dtype_handshake(stage)
    for step in range(2):  # step 0 sets the stages up; step 1 is the one recorded and compared
        for module, _ in modules.values():
            module.zero_grad()
        losses: list[torch.Tensor] = []
        dist.barrier()
        recorder.start()
        runner.step(*inputs, target=y.to(device) if has_last else None, losses=losses if has_last else None)
    grads = {}
    for module, first_layer in modules.values():
        grads.update(global_grads(module, first_layer))
    return {"rank": rank, "stages": mine, "events": recorder.events, "peak": peak_in_flight(recorder.events),
            "loss": torch.stack(losses).mean().item() if has_last else None, "grads": grads}


def schedule_runs(rank: int, world_size: int, schedules: list[str], num_micro: int = 4, micro_rows: int = 2,
                  seed: int = 0, delays: dict[str, float] | None = None) -> dict[str, dict]:
    """``schedule_worker`` for each of ``schedules`` in turn on the same ranks, by name: one launch, not one each."""
    return {name: schedule_worker(rank, world_size, name, num_micro, micro_rows, seed, delays) for name in schedules}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schedules", nargs="+", choices=list(SCHEDULES), default=list(SCHEDULES))
    parser.add_argument("--num-micro", type=int, default=4)
    args = parser.parse_args()
    info = rank_info(module="ddp_tutorial.pipeline_parallel.torch_schedules")
    with distributed():
        for name in args.schedules:
            if not runs_here(name, dist.get_backend()):
                if info.is_main:
                    print(f"{name}: skipped, it fails on torch {torch.__version__} with {dist.get_backend()}")
                continue
            if name == "DualPipeV" and args.num_micro < 2 * info.world_size:
                if info.is_main:
                    print(f"{name}: skipped, torch needs at least as many micro-batches as stages (2 per rank)")
                continue
            result = schedule_worker(info.rank, info.world_size, name, args.num_micro)
            gathered = [None] * info.world_size
            dist.all_gather_object(gathered, result)
            if info.is_main:
                diff = max_difference(gathered, one_process(2 * info.world_size, 2 * args.num_micro))
                peaks = [r["peak"] / SCHEDULES[name][1] for r in gathered]  # a stage of v per rank holds 1/v
                print(f"{name:22s} stages by rank {[r['stages'] for r in gathered]}, peak held (whole-rank "
                      f"micro-batches) {peaks}, "
                      f"equals one process (1e-12): {max(diff.values()) < 1e-12}")


if __name__ == "__main__":
    main()
