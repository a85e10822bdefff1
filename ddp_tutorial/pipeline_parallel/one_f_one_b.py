"""1F1B from scratch: one stage per rank, activations and gradients by ``isend``/``irecv`` (``19_pipeline_schedules``).

Lesson 10's ``pipeline_step`` runs GPipe: all forwards, then all backwards, so a stage
holds every micro-batch's activations at the turn. Here a stage runs any order of actions
(``orders.gpipe_order``, ``orders.one_f_one_b_order``) and records when it ran each one;
with 1F1B stage ``s`` never holds more than ``p - s`` micro-batches. The model is
``2 x stages`` layers of ``pipeline_grid.mlp_stages`` (float64), each rank holding
consecutive layers, checked against one process on the global batch.

    torchrun --nproc-per-node=2 -m ddp_tutorial.pipeline_parallel.one_f_one_b
    torchrun --nproc-per-node=4 -m ddp_tutorial.pipeline_parallel.one_f_one_b --schedule gpipe --num-micro 8
"""

from __future__ import annotations

import argparse
import time
import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
import torch.distributed as dist
from torch import nn

from ddp_tutorial.env import distributed, rank_device, rank_info
from ddp_tutorial.pipeline_parallel.model_parallel import toy_batch
from ddp_tutorial.pipeline_parallel.orders import Event, gpipe_order, one_f_one_b_order, parse_action, peak_in_flight
from ddp_tutorial.pipeline_parallel.pipeline_grid import mlp_stages

__all__ = ["ORDERS", "WIDTH", "OUT_FEATURES", "Recorder", "Held", "build_layers", "stage_module", "one_process",
           "global_grads", "max_difference", "received_after", "run_order", "hand_worker"]

ORDERS = {"gpipe": gpipe_order, "1f1b": one_f_one_b_order}
WIDTH, OUT_FEATURES = 8, 4  # every hidden layer 8 wide: any cut between layers passes 8 numbers per row


class Recorder:
    """This rank's timeline: ``with recorder.action(stage, "F", i):`` around each piece of work.

    ``delays`` (seconds per kind) add a fixed sleep inside each action: a stand-in for a stage's
    compute that the machine's load does not stretch, so measured bubbles can meet the formulas.
    Times count from ``start()``, which every rank calls right after the same barrier.
    """

    def __init__(self, rank: int, delays: dict[str, float] | None = None, device: torch.device | None = None):
        self.rank, self.delays, self.device = rank, delays or {}, device
        self.events: list[Event] = []
        self.t0 = time.perf_counter()
        self.peak_bytes = 0  # set by run_order: the most bytes the stage held at once

    def start(self) -> None:
        self.events, self.t0 = [], time.perf_counter()

    @contextmanager
    def action(self, stage: int, kind: str, micro: int) -> Iterator[None]:
        start = time.perf_counter()
        yield
        if self.device is not None and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # kernels are asynchronous: time their end
        if self.delays.get(kind):
            time.sleep(self.delays[kind])
        self.events.append((self.rank, stage, kind, micro, start - self.t0, time.perf_counter() - self.t0))


class Held:
    """The bytes a stage keeps alive for its micro-batches, and their peak: received inputs, tensors
    saved for backward (``keep`` is the pack hook of ``saved_tensors_hooks``) and sent buffers whose
    send is not done. The parameters and the batch itself (``skip``) do not count; a storage shared
    by several tensors counts once. Weak references: a tensor freed is a tensor no longer held.
    """

    def __init__(self, *skip: torch.Tensor):
        self.skip = {t.untyped_storage().data_ptr() for t in skip}
        self.refs: list[weakref.ref] = []
        self.peak = 0

    def track(self, tensor: torch.Tensor) -> torch.Tensor:
        if tensor.untyped_storage().data_ptr() not in self.skip:
            self.refs.append(weakref.ref(tensor))
        return tensor

    def keep(self, tensor: torch.Tensor) -> torch.Tensor:
        return self.track(tensor.detach())  # a saved output holding itself would be a cycle, freed only by gc

    def sample(self) -> int:
        alive = [(r, t) for r in self.refs if (t := r()) is not None]
        self.refs = [r for r, _ in alive]
        now = sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for _, t in alive}.values())
        self.peak = max(self.peak, now)
        return now


def build_layers(num_layers: int, seed: int = 0) -> list[nn.Module]:
    """The whole model as ``num_layers`` layers (``Linear(8, 8) + ReLU``, the last ``Linear(8, 4)``)."""
    return mlp_stages((WIDTH,) * num_layers + (OUT_FEATURES,), seed)


def stage_module(layers: Sequence[nn.Module], stage: int, num_stages: int) -> tuple[nn.Sequential, int]:
    """Stage ``stage``'s consecutive layers as one module, and the index of its first layer."""
    per = len(layers) // num_stages
    return nn.Sequential(*layers[stage * per:(stage + 1) * per]), stage * per


def global_grads(module: nn.Module, first_layer: int) -> dict[str, torch.Tensor]:
    """A stage's gradients under the whole model's names (``"3.0.weight"``: layer 3's Linear)."""
    grads = {}
    for name, p in module.named_parameters():
        index, rest = name.split(".", 1)
        grads[f"{first_layer + int(index)}.{rest}"] = p.grad.detach().cpu().clone()
    return grads


def one_process(num_layers: int, batch: int, seed: int = 0) -> dict:
    """The reference: the whole model, the whole global batch, one process: loss and gradients."""
    model = nn.Sequential(*build_layers(num_layers, seed))
    x, y = toy_batch(0, batch, seed, WIDTH, OUT_FEATURES)
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    return {"loss": loss.item(), "grads": {n: p.grad.clone() for n, p in model.named_parameters()}}


def max_difference(results: Sequence[dict], reference: dict) -> dict[str, float]:
    """Largest gap to the reference: the loss (from the rank that has it) and every gradient."""
    grads = {n: g for r in results for n, g in r["grads"].items()}
    if set(grads) != set(reference["grads"]):
        raise ValueError(f"the ranks hold {sorted(grads)}, the model has {sorted(reference['grads'])}")
    loss = next(r["loss"] for r in results if r["loss"] is not None)
    return {"loss": abs(loss - reference["loss"]),
            "grads": max((grads[n] - g).abs().max().item() for n, g in reference["grads"].items())}


def received_after(order: Sequence[str]) -> dict[int, list[int]]:
    """For the previous stage's ``order``: forward ``k`` -> the micro-batches whose input gradient it
    has received before it sends ``F<k>`` (each ``B<i>`` paired with the first forward after it)."""
    after: dict[int, list[int]] = {}
    waiting: list[int] = []
    for kind, i in map(parse_action, order):
        if kind == "B":
            waiting.append(i)
        elif waiting:
            after[i], waiting = waiting, []
    return after


def run_order(module: nn.Module, orders: Sequence[Sequence[str]], xs: Sequence[torch.Tensor], *,
              ys: Sequence[torch.Tensor], stage: int, recorder: Recorder) -> torch.Tensor | None:
    """Run ``orders[stage]`` (every stage's order is given) over the micro-batches ``xs`` (targets
    ``ys``); returns the summed loss (last stage).

    Receives block (``irecv(...).wait()``): a stage cannot compute without its input. Sends do
    not (``isend``): a stage never waits for its neighbour to be ready to listen, which is what
    makes 1F1B's crossing messages safe. A sent tensor lives until its send is done, and each is
    waited for (and dropped) as soon as the neighbour is known to have it: ``F<i>``'s output once
    ``B<i>``'s gradient came back, ``B<i>``'s input gradient once the previous stage sent a
    forward it runs after ``B<i>`` (gloo marks a send done only in ``wait``). The peak of bytes
    held (``Held``) goes to ``recorder.peak_bytes``.
    """
    rank, device, order = dist.get_rank(), xs[0].device, orders[stage]
    first, last = stage == 0, stage == len(orders) - 1
    released = {} if first else received_after(orders[stage - 1])
    held = Held(*module.parameters(), *xs, *ys)
    inputs: dict[int, torch.Tensor] = {}
    outputs: dict[int, torch.Tensor] = {}
    sent: dict[tuple[str, int], dist.Work] = {}  # the sends not yet known done, holding their tensors
    loss_sum = torch.zeros((), dtype=torch.float64, device=device) if last else None
    for action in order:
        kind, i = parse_action(action)
        if kind == "F":
            h = xs[i] if first else torch.empty(len(xs[i]), WIDTH, dtype=torch.float64, device=device)
            if not first:
                dist.irecv(h, src=rank - 1).wait()
                h.requires_grad_()
                for j in released.get(i, []):  # the previous stage has these gradients now
                    sent.pop(("B", j)).wait()
            with recorder.action(stage, "F", i), torch.autograd.graph.saved_tensors_hooks(held.keep, lambda t: t):
                out = module(h)
                if last:  # 1/m: the micro-batch losses add up to the global batch's mean
                    out = nn.functional.mse_loss(out, ys[i]) / len(xs)
            inputs[i], outputs[i] = held.track(h), out
            if not last:
                sent[("F", i)] = dist.isend(held.track(out.detach()), dst=rank + 1)
        else:
            grad = None
            if not last:
                grad = torch.empty_like(outputs[i])
                dist.irecv(grad, src=rank + 1).wait()
                sent.pop(("F", i)).wait()  # the next stage ran F<i> before it sent this gradient
            with recorder.action(stage, "B", i):
                outputs[i].backward(grad)
            if last:
                loss_sum += outputs[i].detach()
            if not first:
                sent[("B", i)] = dist.isend(held.track(inputs[i].grad), dst=rank - 1)
            del inputs[i], outputs[i], grad  # this micro-batch's activations are free now
        held.sample()
    for work in sent.values():
        work.wait()
    recorder.peak_bytes = held.peak
    return loss_sum


def hand_worker(rank: int, world_size: int, schedule: str = "1f1b", num_micro: int = 4,
                micro_rows: int = 2, seed: int = 0, delays: dict[str, float] | None = None) -> dict:
    """One stage per rank (2 layers each) running ``schedule``'s order on ``num_micro`` micro-batches.

    Returns the rank's order, its timeline, its peaks (micro-batches from the timeline, bytes
    from ``Held``), the global loss (last stage) and its gradients under the whole model's names.
    """
    device = rank_device()
    module, first_layer = stage_module(build_layers(2 * world_size, seed), rank, world_size)
    module.to(device)
    x, y = toy_batch(0, num_micro * micro_rows, seed, WIDTH, OUT_FEATURES)
    orders = [ORDERS[schedule](s, world_size, num_micro) for s in range(world_size)]
    recorder = Recorder(rank, delays, device)
    dist.barrier()
    recorder.start()
    loss = run_order(module, orders, x.to(device).split(micro_rows), ys=y.to(device).split(micro_rows),
                     stage=rank, recorder=recorder)
    return {"rank": rank, "order": orders[rank], "events": recorder.events, "peak": peak_in_flight(recorder.events),
            "peak_bytes": recorder.peak_bytes, "loss": None if loss is None else loss.item(), "grads": global_grads(module, first_layer)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schedule", choices=sorted(ORDERS), default="1f1b")
    parser.add_argument("--num-micro", type=int, default=8)
    args = parser.parse_args()
    info = rank_info(module="ddp_tutorial.pipeline_parallel.one_f_one_b")
    with distributed():
        result = hand_worker(info.rank, info.world_size, args.schedule, args.num_micro)
        gathered = [None] * info.world_size
        dist.all_gather_object(gathered, result)
    if info.is_main:
        diff = max_difference(gathered, one_process(2 * info.world_size, 2 * args.num_micro))
        for r in gathered:
            print(f"stage {r['rank']}: {' '.join(r['order'])}  (peak {r['peak']} micro-batches held, "
                  f"{r['peak_bytes']} bytes)")
        print(f"{args.schedule} on {info.world_size} stages equals one process (loss and gradients within 1e-12): "
              f"{max(diff.values()) < 1e-12}")


if __name__ == "__main__":
    main()
