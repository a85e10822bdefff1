"""Pipelining a split model with micro-batches, and measuring its idle time (``10_model_parallel_ddp``).

A naive split keeps one device busy at a time: ``dev1`` waits while ``dev0``
works on the whole batch, then ``dev0`` waits. Cut the batch into micro-batches
and ``dev0`` starts micro-batch ``i + 1`` while ``dev1`` works on ``i``. Each
stage runs in its own thread here, the way each GPU runs its own stream of
kernels: on a CPU a thread with one torch thread stands in for a device.

An event is ``(stage, micro_batch, start, end)`` in seconds (or in units of the
whole-batch stage time for ``ideal_schedule``); ``plots.plot_pipeline_timeline``
draws them.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from ddp_tutorial.pipeline_parallel.model_parallel import ToyMpModel

__all__ = ["microbatch_forward", "pipelined_forward", "ideal_schedule", "idle_fraction",
           "bubble_fraction", "measure_pipeline"]

Event = tuple[int, int, float, float]


def microbatch_forward(model: ToyMpModel, x: torch.Tensor, num_micro: int) -> torch.Tensor:
    """The split model on ``num_micro`` slices of the batch, one after another (no overlap yet)."""
    return torch.cat([model(chunk) for chunk in x.tensor_split(num_micro)])


def pipelined_forward(model: ToyMpModel, x: torch.Tensor, num_micro: int,
                      events: list[Event] | None = None) -> torch.Tensor:
    """Forward with stage 0 and stage 1 working on different micro-batches at the same time.

    Same output (and, after ``backward``, same gradients) as ``model(x)``.
    Appends one event per stage and micro-batch to ``events`` when given.
    """
    stages = [(model.stage0, model.dev0), (model.stage1, model.dev1)]
    queues: list[queue.Queue] = [queue.Queue() for _ in range(len(stages) + 1)]
    grad_enabled = torch.is_grad_enabled()  # grad mode is per thread: hand it on
    errors: list[BaseException] = []
    t0 = time.perf_counter()

    def run(s: int) -> None:
        fn, device = stages[s]
        try:
            with torch.set_grad_enabled(grad_enabled):
                while (item := queues[s].get()) is not None:
                    i, h = item
                    start = time.perf_counter()
                    out = fn(h)
                    if device.type == "cuda":
                        torch.cuda.synchronize(device)  # kernels are asynchronous: time their end
                    if events is not None:
                        events.append((s, i, start - t0, time.perf_counter() - t0))
                    queues[s + 1].put((i, out))
        except BaseException as exc:  # re-raised in the caller's thread
            errors.append(exc)
        finally:
            queues[s + 1].put(None)  # let the next stage finish even after an error

    threads = [threading.Thread(target=run, args=(s,), daemon=True) for s in range(len(stages))]
    for t in threads:
        t.start()
    for i, chunk in enumerate(x.tensor_split(num_micro)):
        queues[0].put((i, chunk))
    queues[0].put(None)
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    outputs = []
    while (item := queues[-1].get()) is not None:
        outputs.append(item)
    return torch.cat([out for _, out in sorted(outputs, key=lambda item: item[0])])


def ideal_schedule(num_stages: int, num_micro: int) -> list[Event]:
    """Every stage takes 1 time unit per whole batch; micro-batch ``i`` reaches stage ``s`` at ``(i + s) / M``."""
    t = 1.0 / num_micro
    return [(s, i, (i + s) * t, (i + s + 1) * t) for s in range(num_stages) for i in range(num_micro)]


def idle_fraction(events: list[Event], num_stages: int) -> float:
    """Share of (stages x wall time) in which a stage waited: the pipeline *bubble*."""
    span = max(e[3] for e in events) - min(e[2] for e in events)
    busy = sum(e[3] - e[2] for e in events)
    return 1.0 - busy / (num_stages * span)


def bubble_fraction(num_stages: int, num_micro: int) -> float:
    """The bubble of a balanced pipeline (GPipe): ``(S - 1) / (M + S - 1)``."""
    return (num_stages - 1) / (num_micro + num_stages - 1)


@contextmanager
def _torch_threads(n: int) -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def measure_pipeline(num_micro: int, batch_size: int = 256, width: int = 1024, repeat: int = 5,
                     seed: int = 0, model: ToyMpModel | None = None) -> dict:
    """Time the forward of a wide split model (CPU: one torch thread per stage); keep the fastest run.

    Returns ``{"seconds", "idle", "events"}`` of that run.
    """
    torch.manual_seed(seed)
    model = model or ToyMpModel("cpu", "cpu", width, width, width)
    x = torch.randn(batch_size, model.net1.in_features, device=model.dev0)
    best: dict = {}
    with _torch_threads(1), torch.no_grad():
        pipelined_forward(model, x, num_micro)  # warm-up
        for _ in range(repeat):
            events: list[Event] = []
            start = time.perf_counter()
            pipelined_forward(model, x, num_micro, events)
            seconds = time.perf_counter() - start
            if not best or seconds < best["seconds"]:
                best = {"seconds": seconds, "idle": idle_fraction(events, 2), "events": events}
    return best
