"""What overlapping communication with backward can hide, rung by rung (``08_ddp_from_scratch``).

For each DDP wrapper (torch DDP and the three from-scratch ones) ``exposed_communication``
times three things on every rank, taking turns so that other programs disturb them alike:

- ``step``: a training step (forward, backward, SGD update) with the real process group;
- ``local``: the same step with the same wrapper on a group of this rank alone: the same
  hooks, copies and calls, but an all-reduce with nobody. This is the local compute,
  measured while the other ranks compute too, so they share the cores as in ``step``;
- ``comm``: the all-reduces the wrapper issues in a step (same sizes, same order), done
  back to back with nothing else running: what communication costs without any overlap.

``step - local`` is the communication the step did not hide. Overlap hid ``comm`` minus
that, at best all of it. On a few CPU cores with gloo, though, communication is work for
the same cores that run backward (copies into socket buffers, the TCP stack, gloo's
threads), so it competes with backward instead of running beside it. The gain appears
when the data is moved by other hardware: a NIC's DMA engine, NVLink, or NCCL's kernels on
a GPU's own streams and SMs while the compute kernels run.

``timeline`` shows the overlap itself: a recorded ``BucketedDDP`` backward, when each
gradient became ready and when each bucket's all-reduce started and finished.

``over_simulated_link`` shows overlap paying off: ``FlatDDP`` and ``BucketedDDP`` send their
all-reduces through a ``link.SimulatedLink``, a wire of known bandwidth whose time passes
beside backward (a sleeping thread, no core), as a NIC's or NVLink's does. It also counts,
without any clock, how many messages each wrapper sent before backward's last gradient.
"""

from __future__ import annotations

import copy
import gc
import time
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn

from ddp_tutorial.data_parallel.ddp_from_scratch import WRAPPERS, BucketedDDP
from ddp_tutorial.data_parallel.link import SimulatedLink
from ddp_tutorial.env import rank_device
from ddp_tutorial.models import make_model

__all__ = ["RUNGS", "wrap_rung", "message_sizes", "stepper", "rank_batch", "exposed_communication", "timeline",
           "over_simulated_link", "slowest_rank", "exposed_report", "link_report"]

RUNGS = ("naive", "flat", "bucketed", "torch")


def wrap_rung(kind: str, model: nn.Module, group: dist.ProcessGroup | None = None) -> nn.Module:
    """``kind``'s wrapper (``RUNGS``) around ``model``, communicating over ``group`` (default: the world)."""
    if kind == "torch":
        return nn.parallel.DistributedDataParallel(model, process_group=group)
    return WRAPPERS[kind](model, process_group=group)


def message_sizes(kind: str, ddp: nn.Module, step: Callable[[], object]) -> list[int]:
    """Elements of each all-reduce ``ddp`` issues in one step, in order (``step()`` runs one, for torch DDP)."""
    if kind == "naive":
        return [p.numel() for p in ddp.params]
    if kind == "flat":
        return [sum(p.numel() for p in ddp.params)]
    if kind == "bucketed":
        return [flat.numel() for flat in ddp.flat_buckets]
    sizes: list[int] = []

    def record(state, bucket):  # torch DDP's buckets, as its communication hook sees them
        sizes.append(bucket.buffer().numel())
        fut = torch.futures.Future()
        fut.set_result(bucket.buffer())  # no communication: this step only measures the layout
        return fut

    probe = copy.deepcopy(ddp.module)
    probed = nn.parallel.DistributedDataParallel(probe, process_group=ddp.process_group)
    probed.register_comm_hook(None, record)
    for _ in range(2):  # the second step runs on the rebuilt buckets, as every later step does
        sizes.clear()
        step(probed)
    return sizes


def stepper(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> Callable[[], None]:
    """A function that runs one training step of ``model`` on ``(x, y)``: forward, backward, SGD update."""
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)

    def step() -> None:
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return step


def rank_batch(rank: int, n_in: int, n_out: int, batch_size: int, seed: int,
               device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's random ``(x, y)`` for a model of ``n_in`` inputs and ``n_out`` outputs."""
    gen = torch.Generator().manual_seed(seed + rank)
    return (torch.randn(batch_size, n_in, generator=gen).to(device),
            torch.randn(batch_size, n_out, generator=gen).to(device))


def exposed_communication(rank: int, world_size: int, kinds: tuple[str, ...] = RUNGS, steps: int = 3,
                          repeat: int = 15, batch_size: int = 32, seed: int = 0) -> dict[str, dict[str, float]]:
    """Best seconds of ``step``, ``local`` and ``comm`` (see the module) for each wrapper, on ``DeepMLP`` (~1M)."""
    device = rank_device()
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    alone = [dist.new_group([r]) for r in range(world_size)][rank]  # every rank creates every group
    base, (n_in, n_out) = make_model("big", seed)
    x, y = rank_batch(rank, n_in, n_out, batch_size, seed, device)
    runs, messages = {}, {}
    for kind in kinds:
        ddp = wrap_rung(kind, copy.deepcopy(base).to(device))
        runs[(kind, "step")] = stepper(ddp, x, y)
        runs[(kind, "local")] = stepper(wrap_rung(kind, copy.deepcopy(base).to(device), alone), x, y)
        messages[kind] = [torch.zeros(n, device=device) for n in message_sizes(
            kind, ddp, lambda m: nn.functional.mse_loss(m(x), y).backward())]
    for kind in kinds:  # the same messages, back to back, nothing to overlap with
        runs[(kind, "comm")] = lambda tensors=messages[kind]: [dist.all_reduce(t) for t in tensors]
    best = {key: float("inf") for key in runs}
    for round_ in range(repeat + 1):  # round 0 warms up (and lets torch DDP rebuild its buckets)
        for key, run in runs.items():
            dist.barrier()
            for _ in range(steps):
                start = time.perf_counter()
                run()
                sync()
                if round_:
                    best[key] = min(best[key], time.perf_counter() - start)
    del runs
    gc.collect()
    return {kind: {what: best[(kind, what)] for what in ("step", "local", "comm")} | {
        "messages": len(messages[kind])} for kind in kinds}


def timeline(rank: int, world_size: int, bucket_cap_mb: float = 1.0, batch_size: int = 32,
             num_steps: int = 10, seed: int = 0) -> dict:
    """A recorded BucketedDDP backward: when each gradient was ready, when each bucket's all-reduce
    started and finished, in seconds from the start of backward. Of ``num_steps`` steps the one
    that was slowest on no rank is kept: the least disturbed by other programs."""
    device = rank_device()
    model, (n_in, n_out) = make_model("big", seed)
    ddp = BucketedDDP(model.to(device), bucket_cap_mb=bucket_cap_mb, record_events=True)
    x, y = rank_batch(rank, n_in, n_out, batch_size, seed, device)
    records = []
    for step in range(2 + num_steps):  # 2 warm-up steps
        loss = nn.functional.mse_loss(ddp(x), y)
        dist.barrier()
        start = time.perf_counter()
        loss.backward()
        end = time.perf_counter()
        if step >= 2:
            records.append((end - start, [(kind, index, t - start) for kind, index, t in ddp.events]))
    slowest = torch.tensor([r[0] for r in records], dtype=torch.float64, device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    backward, events = records[int(slowest.argmin())]
    result = {"events": events, "backward": backward, "buckets": ddp.buckets,
              "names": [name for name, _ in model.named_parameters()]}
    del ddp
    gc.collect()
    return result


def over_simulated_link(rank: int, world_size: int, bandwidth: float = 125e6, bucket_cap_mb: float = 0.5,
                        batch_size: int = 256, repeat: int = 6, seed: int = 0) -> dict[str, dict]:
    """``FlatDDP`` and ``BucketedDDP`` on ``DeepMLP`` with a ``SimulatedLink`` of ``bandwidth`` bytes/s.

    Per wrapper: ``step`` (best seconds of a training step over the link), ``local`` (best
    seconds of the same step of the bare model: the compute, one baseline for both, so that
    their exposed times compare as their steps do), ``wire`` (the
    seconds its messages occupy the wire, from their sizes), ``messages`` and ``early``
    (how many were sent before backward's last gradient was ready: a count, not a time).
    """
    device = rank_device()
    base, (n_in, n_out) = make_model("big", seed)
    x, y = rank_batch(rank, n_in, n_out, batch_size, seed, device)
    kinds = ("flat", "bucketed")
    runs, links, ready = {}, {}, {kind: [] for kind in kinds}
    for kind in kinds:
        options = {"bucket_cap_mb": bucket_cap_mb} if kind == "bucketed" else {}
        model = copy.deepcopy(base).to(device)
        links[kind] = SimulatedLink(bandwidth)
        for p in model.parameters():  # registered before the wrapper's hooks, so each fires first
            # How many messages had been sent when this gradient became ready: a count, no clock.
            p.register_post_accumulate_grad_hook(lambda p, link=links[kind], seen=ready[kind]: seen.append(
                sum(what == "send" for what, _, _ in link.events)))
        runs[(kind, "step")] = stepper(WRAPPERS[kind](model, link=links[kind], **options), x, y)
    runs[("bare", "local")] = stepper(copy.deepcopy(base).to(device), x, y)
    best = {key: float("inf") for key in runs}
    for round_ in range(repeat + 1):  # round 0 warms up; taking turns, load disturbs every run alike
        for key, run in runs.items():
            dist.barrier()
            if key[0] in links:
                ready[key[0]].clear()
                links[key[0]].events.clear()
            start = time.perf_counter()
            run()
            if round_:
                best[key] = min(best[key], time.perf_counter() - start)
    result = {}
    for kind in kinds:  # the last round's step, over the link: its messages against backward's last gradient
        ready[kind].clear()
        links[kind].events.clear()
        runs[(kind, "step")]()
        sent = [(nbytes, t) for what, nbytes, t in links[kind].events if what == "send"]
        result[kind] = {"step": best[(kind, "step")], "local": best[("bare", "local")], "messages": len(sent),
                        "wire": sum(links[kind].wire_seconds(n, world_size) for n, _ in sent),
                        "early": ready[kind][-1]}  # sent before the last gradient's hooks ran
        links[kind].close()
    del runs
    gc.collect()
    return result


NAMES = {"naive": "NaiveDDP", "flat": "FlatDDP", "bucketed": "BucketedDDP", "torch": "torch DDP"}


def slowest_rank(per_rank: list[dict[str, dict]]) -> dict[str, dict]:
    """Each wrapper's row with every time taken from the slowest rank (counts from rank 0)."""
    return {kind: {what: (max(r[kind][what] for r in per_rank) if isinstance(value, float) else value)
                   for what, value in row.items()} for kind, row in per_rank[0].items()}


def exposed_report(timed: dict[str, dict], alone: str = "comm") -> str:
    """A table in ms: step, local, exposed (= step - local) and ``alone`` (``comm`` or ``wire``) per wrapper."""
    label = {"comm": "comm alone", "wire": "wire time"}[alone]
    lines = [f"{'':12s} {'step':>8s} {'local':>8s} {'exposed':>8s} {label:>10s}   (ms; exposed = step - local)"]
    for kind, t in timed.items():
        lines.append(f"{NAMES[kind]:12s} {1e3 * t['step']:8.2f} {1e3 * t['local']:8.2f} "
                     f"{1e3 * (t['step'] - t['local']):8.2f} {1e3 * t[alone]:10.2f}   {t['messages']} all-reduce(s)")
    return "\n".join(lines)


def link_report(timed: dict[str, dict]) -> str:
    """``over_simulated_link``'s rows (from ``slowest_rank``) in ms: each wrapper's step and wire time, and
    how much shorter each step was than ``FlatDDP``'s, the wrapper whose wire time cannot overlap."""
    flat = timed["flat"]["step"]
    lines = [f"bare model, no communication: step {1e3 * timed['flat']['local']:7.2f} ms"]
    for kind, t in timed.items():
        lines.append(f"{NAMES[kind]:12s} step {1e3 * t['step']:7.2f} ms, {t['messages']:2d} message(s), "
                     f"{1e3 * t['wire']:.2f} ms on the wire" + ("" if kind == "flat" else
                                                                  f"; {1e3 * (flat - t['step']):.2f} ms shorter than FlatDDP's"))
    return "\n".join(lines)
