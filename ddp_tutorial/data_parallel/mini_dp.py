"""``nn.DataParallel`` taken apart: scatter, replicate, parallel_apply, gather (``01_data_parallel``).

``nn.DataParallel(model)`` runs ONE process that drives several GPUs from
threads. Every forward call it

1. **scatters** the batch: splits it along dim 0, one chunk per device;
2. **replicates** the module: copies every parameter and buffer to every other device
   (the replica on the main device uses the originals);
3. **parallel-applies**: runs each replica on its chunk, one Python thread each;
4. **gathers** the outputs: concatenates them on the main device (``cuda:0``).

On backward the copies' gradients are **summed on the main device**, into the
original parameters, where the optimizer updates them. ``MiniDataParallel``
below is built from exactly these four steps and runs on CPU: a "device" there
is a label, so the mechanics (and their costs) are visible without GPUs.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import torch
from torch import nn

from ddp_tutorial.timing import timed


class Broadcast(torch.autograd.Function):
    """Forward: ``tensor`` per device. Backward: sum the copies' gradients on the main device."""

    @staticmethod
    def forward(ctx, devices: Sequence[torch.device], tensor: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ctx.main = tensor.device
        # devices[0] is the main device: like torch's broadcast_coalesced, it gets the
        # original (a view, no copy); every other device gets a copy.
        return tuple(tensor.view_as(tensor) if i == 0 else tensor.to(device, copy=True)
                     for i, device in enumerate(devices))

    @staticmethod
    def backward(ctx, *grads: torch.Tensor) -> tuple[None, torch.Tensor]:
        # This is DataParallel's gradient "reduce": every replica's gradient travels to the main device.
        return None, sum(g.to(ctx.main) for g in grads)


def scatter(batch: torch.Tensor, devices: Sequence[torch.device]) -> list[torch.Tensor]:
    """Step 1: split the batch along dim 0 into one chunk per device (the last chunks may be smaller)."""
    chunks = torch.chunk(batch, len(devices), dim=0)
    return [chunk.to(device) for chunk, device in zip(chunks, devices)]


def _shallow_copy(module: nn.Module) -> nn.Module:
    # nn.Module keeps its parameters, buffers and children in the dicts _parameters, _buffers and
    # _modules, and no public API builds a module around given tensors: torch's own replicate
    # (torch/nn/parallel/replicate.py) copies modules this way too.
    replica = module.__new__(type(module))
    replica.__dict__ = module.__dict__.copy()
    replica._parameters = {}  # the copies become plain attributes: they are not leaves any more
    replica._buffers = module._buffers.copy()
    replica._modules = module._modules.copy()
    return replica


def replicate(module: nn.Module, devices: Sequence[torch.device]) -> list[nn.Module]:
    """Step 2: one replica per device whose parameters are differentiable copies of ``module``'s.

    Gradients flowing into a replica's parameters end up summed in the original
    ``param.grad`` (see ``Broadcast``). A parameter used twice is copied once.
    Buffers (BatchNorm statistics) are copied without gradients. The replica on
    the main device (``devices[0]``) uses views of the originals: no copy.
    """
    devices = [torch.device(d) for d in devices]
    copies = {id(p): Broadcast.apply(devices, p) for p in module.parameters()}
    # Like nn.DataParallel: the replica on the main device keeps the original buffers, so its
    # BatchNorm statistics are the ones that persist; the other replicas' updates are lost.
    buffers = {id(b): [b if i == 0 and d == b.device else b.detach().to(d, copy=True)
                       for i, d in enumerate(devices)] for b in module.buffers()}
    originals = list(module.modules())
    replicas = []
    for i in range(len(devices)):
        twin = {id(m): _shallow_copy(m) for m in originals}
        for m in originals:
            r = twin[id(m)]
            # nn.Module's own dicts, filled as torch's replicate does: no public API sets them
            for name, p in m._parameters.items():
                setattr(r, name, None if p is None else copies[id(p)][i])
            for name, b in m._buffers.items():
                r._buffers[name] = None if b is None else buffers[id(b)][i]
            for name, child in m._modules.items():
                r._modules[name] = None if child is None else twin[id(child)]
        replicas.append(twin[id(module)])
    return replicas


def parallel_apply(replicas: Sequence[nn.Module], inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Step 3: run ``replicas[i](inputs[i])`` in one thread per replica, all inside this one process."""
    results: list = [None] * len(replicas)
    grad_enabled = torch.is_grad_enabled()  # grad mode is per thread: carry the caller's into each

    def work(i: int) -> None:
        try:
            with torch.set_grad_enabled(grad_enabled):
                results[i] = replicas[i](inputs[i])
        except BaseException as exc:  # re-raised in the caller's thread below
            results[i] = exc

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(replicas))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return results


def gather(outputs: Sequence[torch.Tensor], main: torch.device) -> torch.Tensor:
    """Step 4: bring every replica's output to the main device and concatenate along dim 0."""
    return torch.cat([out.to(main) for out in outputs], dim=0)


class MiniDataParallel(nn.Module):
    """``nn.DataParallel`` from the four steps. ``devices`` default: every GPU, else 2 CPU "devices".

    The wrapped module must live on ``devices[0]``, the main device, like with
    ``nn.DataParallel`` (whose main device is ``cuda:0``).
    """

    def __init__(self, module: nn.Module, devices: Sequence[torch.device | str] | None = None):
        super().__init__()
        if devices is None:
            count = torch.cuda.device_count() if torch.cuda.is_available() else 0
            devices = [f"cuda:{i}" for i in range(count)] if count else ["cpu", "cpu"]
        self.module = module
        self.devices = [torch.device(d) for d in devices]

    def forward(self, batch: torch.Tensor) -> torch.Tensor:
        inputs = scatter(batch, self.devices)
        devices = self.devices[:len(inputs)]  # a batch smaller than the device count uses fewer
        replicas = replicate(self.module, devices)  # every step: the weights changed since last time
        outputs = parallel_apply(replicas, inputs)
        return gather(outputs, self.devices[0])


# ----------------------------------------------------------------- what it costs


def phase_seconds(module: nn.Module, batch: torch.Tensor, devices: Sequence[torch.device | str],
                  repeat: int = 5) -> dict[str, float]:
    """Best time of each step of ``MiniDataParallel`` over ``repeat`` training iterations (forward + backward)."""
    devices = [torch.device(d) for d in devices]
    best: dict[str, float] = {}

    def clock(name: str, start: float) -> float:
        now = time.perf_counter()
        best[name] = min(best.get(name, float("inf")), now - start)
        return now

    for _ in range(repeat + 1):  # the first round warms up
        t = time.perf_counter()
        inputs = scatter(batch, devices)
        t = clock("scatter", t)
        replicas = replicate(module, devices)
        t = clock("replicate", t)
        outputs = parallel_apply(replicas, inputs)
        t = clock("parallel_apply", t)
        out = gather(outputs, devices[0])
        t = clock("gather", t)
        out.sum().backward()  # includes the reduce: Broadcast's backward sums into param.grad
        clock("backward + reduce", t)
        module.zero_grad(set_to_none=True)
    return best


def replicate_seconds(module: nn.Module, num_replicas: int = 2, repeat: int = 5) -> float:
    """Time to copy ``module`` to ``num_replicas`` devices: DataParallel pays it on every forward."""
    return timed(lambda: replicate(module, ["cpu"] * num_replicas), repeat)


def thread_speedup(module: nn.Module, batch: torch.Tensor, num_replicas: int = 2, repeat: int = 5) -> float:
    """How much faster the replicas run in threads than one after another (1 torch thread each).

    Above 1 only when the work happens inside torch kernels, which release the
    GIL; Python-heavy forwards (many tiny layers) hold the GIL and stay near 1.
    """
    devices = [torch.device("cpu")] * num_replicas
    replicas = replicate(module, devices)
    inputs = scatter(batch, devices)
    previous = torch.get_num_threads()
    torch.set_num_threads(1)  # let the threads, not torch's own intra-op pool, do the parallel work
    try:
        with torch.no_grad():
            one_by_one = timed(lambda: [r(x) for r, x in zip(replicas, inputs)], repeat)
            threaded = timed(lambda: parallel_apply(replicas, inputs), repeat)
    finally:
        torch.set_num_threads(previous)
    return one_by_one / threaded


def bytes_per_device(module: nn.Module, batch: torch.Tensor, num_devices: int,
                     optimizer_states: int = 2) -> list[dict[str, int]]:
    """Bytes each device holds during one DataParallel step, from the real tensor sizes.

    The main device (0) also keeps the whole batch, the gathered outputs, the
    summed gradients and the optimizer's state (``optimizer_states`` tensors per
    parameter: 2 for Adam); the others hold only their chunk and a replica. The
    replica on device 0 shares the master weights (``broadcast_coalesced`` hands
    back the originals for the source device), so only its gradients count there.
    """
    devices = [torch.device("cpu")] * num_devices
    params = sum(p.numel() * p.element_size() for p in module.parameters())
    chunks = scatter(batch, devices)
    with torch.no_grad():
        outputs = parallel_apply(replicate(module, devices), chunks)
    rows = []
    for i, (chunk, out) in enumerate(zip(chunks, outputs)):
        row = {"replica weights + grads" if i else "replica grads": (2 if i else 1) * params,
               "input chunk + output chunk": chunk.numel() * chunk.element_size() + out.numel() * out.element_size()}
        if i == 0:
            whole_out = sum(o.numel() * o.element_size() for o in outputs)
            row["whole batch + gathered outputs"] = batch.numel() * batch.element_size() + whole_out
            row["master weights, grads, optimizer"] = (2 + optimizer_states) * params
        rows.append(row)
    return rows
