"""DistributedDataParallel written from scratch, three ways (``08_ddp_from_scratch``).

- ``NaiveDDP``: after backward, one all-reduce per parameter.
- ``FlatDDP``: after backward, all gradients copied into one flat tensor, one all-reduce.
- ``BucketedDDP``: gradient hooks fill buckets of ``bucket_cap_mb`` in the order gradients
  become ready (approximated by reverse registration order); each full bucket starts an asynchronous
  all-reduce while backward goes on computing the remaining gradients.

Each takes ``link=`` (``link.SimulatedLink``) to send its all-reduces over a simulated wire.
All three keep torch DDP's contract: construction broadcasts rank 0's parameters and
buffers (buffers again before every forward that records gradients), and when
``loss.backward()`` returns every ``param.grad`` holds the mean over ranks.

Run the comparison with ``torch.nn.parallel.DistributedDataParallel``:

    torchrun --nproc-per-node=2 -m ddp_tutorial.data_parallel.ddp_from_scratch
    python -m ddp_tutorial.data_parallel.ddp_from_scratch        # alone: a world of one
"""

from __future__ import annotations

import argparse
import copy
import time
from functools import partial
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ddp_tutorial.env import distributed, rank_device
from ddp_tutorial.models import make_model

__all__ = ["FromScratchDDP", "NaiveDDP", "FlatDDP", "BucketedDDP", "assign_buckets", "WRAPPERS",
           "grad_ready_order", "compare_with_torch_ddp"]


class FromScratchDDP(nn.Module):
    """What the three share: the broadcasts, and a callback that runs when backward ends."""

    def __init__(self, module: nn.Module, process_group=None, broadcast_buffers: bool = True, *, link=None):
        super().__init__()
        self.module = module
        self.group = process_group
        self.link = link  # e.g. link.SimulatedLink: the all-reduces also cross a wire of known bandwidth
        self.world_size = dist.get_world_size(process_group)
        self.src = 0 if process_group is None else dist.get_global_rank(process_group, 0)
        self.broadcast_buffers = broadcast_buffers
        self.params = [p for p in module.parameters() if p.requires_grad]
        self._callback_queued = False
        with torch.no_grad():  # every rank starts from rank 0's weights, whatever its seed
            for t in list(module.parameters()) + list(module.buffers()):
                dist.broadcast(t, self.src, group=process_group)
        for i, p in enumerate(self.params):
            # Fires once per backward, after all uses of p have been summed into p.grad.
            p.register_post_accumulate_grad_hook(partial(self._hook, i))

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        # E.g. BatchNorm statistics: rank 0's win, as in torch DDP. Simplified: we skip it under
        # no_grad; torch DDP goes by the *previous* forward's grad mode, so its first no_grad
        # forward after training still broadcasts. Evaluate on one rank with ddp.module(x).
        if self.broadcast_buffers and torch.is_grad_enabled():
            with torch.no_grad():
                for b in self.module.buffers():
                    dist.broadcast(b, self.src, group=self.group)
        return self.module(*args, **kwargs)

    def _hook(self, index: int, param: torch.Tensor) -> None:
        if not self._callback_queued:
            # The autograd engine calls this once the whole backward pass is done.
            self._callback_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._end_of_backward)
        self.grad_ready(index, param)

    def _end_of_backward(self) -> None:
        self._callback_queued = False
        # An unused parameter still takes part, with a zero gradient. Unlike torch DDP, which leaves
        # the .grad of a parameter no rank used as it was (None), so the optimizer skips it: with a
        # zero gradient, momentum and weight decay still move it.
        for p in self.params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        self.finish()

    def all_reduce(self, tensor: torch.Tensor, async_op: bool = False):
        """Sum ``tensor`` over the group (a handle when ``async_op``), through ``link`` when there is one."""
        if self.link is not None:
            return self.link.all_reduce(tensor, self.group, async_op)
        return dist.all_reduce(tensor, group=self.group, async_op=async_op)

    def grad_ready(self, index: int, param: torch.Tensor) -> None:
        """Called as soon as ``param.grad`` is final for this backward."""

    def finish(self) -> None:
        raise NotImplementedError


class NaiveDDP(FromScratchDDP):
    """One blocking all-reduce per parameter once backward is over: correct, and slow."""

    def finish(self) -> None:
        for p in self.params:
            self.all_reduce(p.grad)
            p.grad.div_(self.world_size)


class FlatDDP(FromScratchDDP):
    """All gradients in one flat tensor, one all-reduce: few calls, but no overlap with backward."""

    def finish(self) -> None:
        flat = torch.cat([p.grad.reshape(-1) for p in self.params])
        self.all_reduce(flat)
        flat.div_(self.world_size)
        for p, chunk in zip(self.params, flat.split([p.numel() for p in self.params])):
            p.grad.copy_(chunk.view_as(p))


def assign_buckets(params: list[torch.Tensor], bucket_cap_mb: float = 25.0,
                   first_bucket_mb: float | None = None) -> list[list[int]]:
    """Parameter indices per bucket, last parameter first (approximating the order backward produces gradients).

    A bucket takes parameters until the next one would push it past ``bucket_cap_mb``
    (the first bucket: past ``first_bucket_mb``, when given and smaller); a parameter
    bigger than the cap gets a bucket of its own.
    """
    buckets: list[list[int]] = []
    size = 0.0
    for i in reversed(range(len(params))):
        p = params[i]
        nbytes = p.numel() * p.element_size()
        cap = bucket_cap_mb if len(buckets) != 1 or first_bucket_mb is None else min(bucket_cap_mb, first_bucket_mb)
        same_kind = buckets and (p.dtype, p.device) == (params[buckets[-1][0]].dtype, params[buckets[-1][0]].device)
        if buckets and same_kind and size + nbytes <= cap * 2**20:
            buckets[-1].append(i)
            size += nbytes
        else:
            buckets.append([i])
            size = nbytes
    return buckets


class BucketedDDP(FromScratchDDP):
    """Gradients are copied into buckets as they become ready; a full bucket's all-reduce starts at once.

    Buckets start in a fixed order on every rank (collectives must match across ranks),
    so a bucket that fills early waits for the ones before it. Like torch DDP, the first
    bucket is capped at ``first_bucket_mb`` (1 MB) so that communication starts early
    even with a large ``bucket_cap_mb``. ``flat_buckets`` holds each bucket's flat tensor,
    the one its all-reduce sends. With ``record_events`` the last step's events are kept
    in ``events`` as ``(kind, index, time)`` for a timeline.
    """

    def __init__(self, module: nn.Module, bucket_cap_mb: float = 25.0, process_group=None,
                 broadcast_buffers: bool = True, first_bucket_mb: float | None = 1.0,
                 record_events: bool = False, *, link=None):
        super().__init__(module, process_group, broadcast_buffers, link=link)
        self.buckets = assign_buckets(self.params, bucket_cap_mb, first_bucket_mb)
        self.record_events = record_events
        self.events: list[tuple[str, int, float]] = []
        self.flat_buckets: list[torch.Tensor] = []
        self._views, self._bucket_of = {}, {}
        for b, indices in enumerate(self.buckets):
            first = self.params[indices[0]]
            flat = torch.zeros(sum(self.params[i].numel() for i in indices), dtype=first.dtype, device=first.device)
            offset = 0
            for i in indices:
                n = self.params[i].numel()
                self._views[i] = flat[offset:offset + n].view_as(self.params[i])
                self._bucket_of[i] = b
                offset += n
            self.flat_buckets.append(flat)
        self._reset()

    def _reset(self) -> None:
        self._missing = [len(indices) for indices in self.buckets]
        self._ready = [False] * len(self.params)
        self._works: list = []
        self._next_bucket = 0

    def _event(self, kind: str, index: int) -> None:
        if self.record_events:
            self.events.append((kind, index, time.perf_counter()))

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        self.events = []
        return super().forward(*args, **kwargs)

    def grad_ready(self, index: int, param: torch.Tensor) -> None:
        self._event("ready", index)
        # Divide first, as torch DDP does: the sum of the shares is the mean.
        torch.div(param.grad, self.world_size, out=self._views[index])
        self._ready[index] = True
        self._missing[self._bucket_of[index]] -= 1
        self._launch_ready_buckets()

    def _launch_ready_buckets(self) -> None:
        while self._next_bucket < len(self.buckets) and self._missing[self._next_bucket] == 0:
            b = self._next_bucket
            self._event("launch", b)
            work = self.all_reduce(self.flat_buckets[b], async_op=True)
            if self.record_events:  # runs on the communication thread when the bucket is reduced
                work.get_future().then(lambda fut, b=b: self._event("done", b))
            self._works.append(work)
            self._next_bucket += 1

    def finish(self) -> None:
        for i, p in enumerate(self.params):
            if not self._ready[i]:  # unused in this forward: its share is zero
                self.grad_ready(i, p)
        for work in self._works:
            work.wait()
        for i, p in enumerate(self.params):
            p.grad.copy_(self._views[i])
        self._event("end", -1)
        self._reset()


WRAPPERS = {"naive": NaiveDDP, "flat": FlatDDP, "bucketed": BucketedDDP}


def grad_ready_order(model: nn.Module, x: torch.Tensor) -> list[str]:
    """Names of the parameters in the order their gradients become final during one backward (one process)."""
    order: list[str] = []
    handles = [p.register_post_accumulate_grad_hook(lambda p, name=name: order.append(name))
               for name, p in model.named_parameters()]
    try:
        model(x).square().mean().backward()
    finally:
        for h in handles:
            h.remove()
    return order


def compare_with_torch_ddp(rank: int, world_size: int, model_name: str = "mlp", *, num_steps: int = 5,
                           bucket_cap_mb: float = 0.002, lr: float = 0.05, batch_size: int = 8,
                           dtype: torch.dtype = torch.float64, kinds: tuple[str, ...] = ("naive", "flat", "bucketed"),
                           seed: int = 0) -> dict[str, float]:
    """Train torch DDP and each from-scratch DDP side by side; the largest difference in any parameter or buffer.

    Each rank builds its model from a different seed on purpose: the broadcast at
    construction must make them equal. Each rank gets its own batch every step.
    """
    device = rank_device()
    base, (n_in, n_out) = make_model(model_name, seed + rank, dtype)
    base.to(device)
    ref = nn.parallel.DistributedDataParallel(copy.deepcopy(base))
    ours = {k: WRAPPERS[k](copy.deepcopy(base), **({"bucket_cap_mb": bucket_cap_mb} if k == "bucketed" else {}))
            for k in kinds}
    models = {"torch": ref, **ours}
    optims = {k: torch.optim.SGD(m.parameters(), lr=lr, momentum=0.9) for k, m in models.items()}
    gen = torch.Generator().manual_seed(1000 * seed + rank)
    for _ in range(num_steps):
        x = torch.randn(batch_size, n_in, generator=gen, dtype=dtype).to(device)
        y = torch.randn(batch_size, n_out, generator=gen, dtype=dtype).to(device)
        for k, m in models.items():
            optims[k].zero_grad()
            nn.functional.mse_loss(m(x), y).backward()
            optims[k].step()
    want = list(ref.module.parameters()) + list(ref.module.buffers())
    diffs = {}
    for k in kinds:
        got = list(ours[k].module.parameters()) + list(ours[k].module.buffers())
        diffs[k] = max((a.double() - b.double()).abs().max().item() for a, b in zip(want, got))
    return diffs


def main() -> None:
    parser = argparse.ArgumentParser(description="from-scratch DDP against torch DDP")
    parser.add_argument("--model", default="mlp", choices=["toy", "shared", "mlp", "big"])
    parser.add_argument("--steps", dest="num_steps", type=int, default=5)
    parser.add_argument("--bucket-cap-mb", type=float, default=0.002)
    args = parser.parse_args()
    with distributed() as (info, _):
        diffs = compare_with_torch_ddp(info.rank, info.world_size, args.model, num_steps=args.num_steps,
                                       bucket_cap_mb=args.bucket_cap_mb)
        if info.is_main:
            for kind, diff in diffs.items():
                print(f"{kind:>8}: largest difference from torch DDP after {args.num_steps} steps "
                      f"on {info.world_size} rank(s): {diff:.2e}")


if __name__ == "__main__":
    main()
