"""DistributedDataParallel, one process per device, started by spawn (``07_ddp_spawn``).

Every worker here has the rank-first signature ``worker(rank, world_size, ...)``
so the notebook starts it with ``ddp_tutorial.launch.spawn`` (the process group
is ready when it runs). From a shell, the classic ``torch.multiprocessing.spawn``
recipe in ``main()`` starts the toy example, or torchrun does:

    python -m ddp_tutorial.data_parallel.ddp_spawn                     # mp.spawn, 2 processes
    python -m ddp_tutorial.data_parallel.ddp_spawn --world-size 3
    torchrun --nproc-per-node=2 -m ddp_tutorial.data_parallel.ddp_spawn

On GPUs each rank uses ``cuda:local_rank`` with NCCL; on CPU, gloo.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from ddp_tutorial.env import choose_backend, distributed, launched_by_torchrun, rank_device, set_device_for
from ddp_tutorial.launch import LOCALHOST, free_port
from ddp_tutorial.models import ToyModel
from ddp_tutorial.training.checkpoint import save_checkpoint


def wrap(model: nn.Module, device: torch.device, process_group: dist.ProcessGroup | None = None) -> DDP:
    """Move ``model`` to this rank's device and wrap it; DDP broadcasts rank 0's weights here."""
    model = model.to(device)
    return DDP(model, device_ids=[device.index] if device.type == "cuda" else None, process_group=process_group)


def checksum(module: nn.Module) -> float:
    """A fingerprint of the weights (their sum in float64): different weights practically never share it."""
    return sum(p.detach().double().sum().item() for p in module.parameters())


def toy_example(rank: int, world_size: int, num_steps: int = 5, lr: float = 0.01) -> dict:
    """The basic DDP loop: ToyModel, random data that differs per rank, MSE loss, SGD."""
    device = rank_device()
    torch.manual_seed(0)  # every rank builds the same initial weights
    model = wrap(ToyModel(), device)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    data = torch.Generator().manual_seed(1000 + rank)  # ...but sees its own data
    losses = []
    for _ in range(num_steps):
        x = torch.randn(20, 10, generator=data).to(device)
        y = torch.randn(20, 5, generator=data).to(device)
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()  # gradients are averaged over the ranks during backward
        optimizer.step()
        losses.append(loss.item())
    print(f"rank {rank}: local loss {losses[0]:.3g} -> {losses[-1]:.3g}")
    return {"losses": losses, "checksum": checksum(model)}


def initial_weights(rank: int, world_size: int, seed_per_rank: bool = True) -> dict:
    """Weights before and after ``DDP(...)``: a seed per rank (a bug) makes them differ, DDP fixes it."""
    torch.manual_seed(rank if seed_per_rank else 0)
    model = ToyModel().to(rank_device())
    before = checksum(model)
    ddp = wrap(model, rank_device())
    return {"before": before, "after": checksum(ddp.module)}


def sampler_orders(rank: int, world_size: int, dataset_len: int, num_epochs: int,
                   set_epoch: bool = True, seed: int = 0) -> list[list[int]]:
    """The sample indices ``rank`` draws in each epoch. Needs no process group (rank and world_size are given)."""
    sampler = DistributedSampler(range(dataset_len), num_replicas=world_size, rank=rank, shuffle=True, seed=seed)
    orders = []
    for epoch in range(num_epochs):
        if set_epoch:
            sampler.set_epoch(epoch)  # the shuffle is seeded with seed + epoch
        orders.append(list(sampler))
    return orders


def regression_data(num_samples: int = 64, seed: int = 0, dtype: torch.dtype = torch.float32) -> TensorDataset:
    """A fixed synthetic regression set for ToyModel: y = x @ W + noise."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(num_samples, 10, generator=g, dtype=torch.float64)
    weight = 0.3 * torch.randn(10, 5, generator=g, dtype=torch.float64)
    y = x @ weight + 0.1 * torch.randn(num_samples, 5, generator=g, dtype=torch.float64)
    return TensorDataset(x.to(dtype), y.to(dtype))


def train_epochs(model: nn.Module, loader: DataLoader, num_epochs: int, lr: float,
                 device: torch.device) -> list[float]:
    """The loop ``train_ddp`` and ``train_single`` share: SGD over ``num_epochs`` epochs; the losses."""
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for epoch in range(num_epochs):
        loader.sampler.set_epoch(epoch)
        for x, y in loader:
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(model(x.to(device)), y.to(device))
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    return losses


def train_ddp(rank: int, world_size: int, dataset: TensorDataset, batch_size: int, num_epochs: int,
              lr: float, seed: int = 0) -> dict:
    """DDP training with a per-process ``batch_size``: the global batch is ``batch_size * world_size``."""
    device = rank_device()
    torch.manual_seed(seed)
    model = wrap(ToyModel().to(dataset.tensors[0].dtype), device)
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=seed)
    losses = train_epochs(model, DataLoader(dataset, batch_size=batch_size, sampler=sampler), num_epochs, lr, device)
    return {"losses": losses, "state": {k: v.cpu() for k, v in model.module.state_dict().items()}}


def train_single(dataset: TensorDataset, batch_size: int, num_epochs: int, lr: float, seed: int = 0) -> dict:
    """The same training in one process: the reference DDP must match on the same global batch."""
    torch.manual_seed(seed)
    model = ToyModel().to(dataset.tensors[0].dtype)
    # A one-replica sampler shuffles exactly like DistributedSampler does on N ranks
    # (same seed + epoch); rank r takes every N-th index of that permutation.
    sampler = DistributedSampler(dataset, num_replicas=1, rank=0, shuffle=True, seed=seed)
    losses = train_epochs(model, DataLoader(dataset, batch_size=batch_size, sampler=sampler), num_epochs, lr,
                    torch.device("cpu"))
    return {"losses": losses, "state": model.state_dict()}


# ----------------------------------------------------------------- checkpoints


def _train_a_little(device: torch.device, num_steps: int) -> DDP:
    torch.manual_seed(0)
    model = wrap(ToyModel(), device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(dist.get_rank())
    for _ in range(num_steps):
        optimizer.zero_grad()
        model(torch.randn(8, 10, generator=g).to(device)).pow(2).mean().backward()
        optimizer.step()
    return model


def checkpoint_round_trip(rank: int, world_size: int, path: str, num_steps: int = 3) -> dict:
    """Train, save on rank 0 only, ``barrier``, then every rank loads onto its own device."""
    device = rank_device()
    model = _train_a_little(device, num_steps)
    if rank == 0:  # one writer: N ranks writing the same file would race
        save_checkpoint({"model": model.module.state_dict(), "step": num_steps}, path)
    dist.barrier()  # nobody reads before rank 0 has finished writing
    # map_location: tensors saved from cuda:0 would otherwise all land on rank 0's GPU
    state = torch.load(path, map_location=device, weights_only=True)
    torch.manual_seed(100 + rank)  # a fresh model whose weights differ everywhere
    fresh = ToyModel().to(device)
    fresh.load_state_dict(state["model"])
    dist.barrier()  # keep the file until every rank has read it (the caller may delete it)
    return {"trained": checksum(model.module), "loaded": checksum(fresh), "step": state["step"],
            "loaded onto": str(next(iter(state["model"].values())).device)}


# ----------------------------------------------------------------- accumulation, uneven inputs


def counting_allreduce_hook(state, bucket):  # no annotations: DDP checks them and our future-import makes strings
    """A DDP communication hook: counts in ``state["all_reduces"]``, then does DDP's default."""
    state["all_reduces"] += 1  # otherwise exactly DDP's default: all-reduce, divide by world_size
    return default_hooks.allreduce_hook(None, bucket)


ACCUMULATION_MODES = ("no_sync", "backward only in no_sync", "every step")


def accumulate(rank: int, world_size: int, micro_batches: int = 4) -> dict:
    """Gradient accumulation over ``micro_batches`` in each of ``ACCUMULATION_MODES``: all-reduces and gradients.

    DDP decides in the *forward* whether the coming backward all-reduces (it reads
    ``require_backward_grad_sync``, which ``no_sync`` turns off): so forward and backward
    both go inside ``no_sync``. With only the backward inside, every backward still syncs.
    """
    device = rank_device()
    g = torch.Generator().manual_seed(rank)
    batches = [torch.randn(4, 10, generator=g).to(device) for _ in range(micro_batches)]
    results = {}
    for mode in ACCUMULATION_MODES:
        torch.manual_seed(0)
        model = wrap(ToyModel(), device)
        counter = {"all_reduces": 0}
        model.register_comm_hook(counter, counting_allreduce_hook)
        for i, x in enumerate(batches):
            skip_sync = mode != "every step" and i < micro_batches - 1  # the last micro-batch syncs
            if skip_sync and mode == "no_sync":
                with model.no_sync():  # forward and backward: gradients just add up in param.grad
                    (model(x).pow(2).mean() / micro_batches).backward()
            elif skip_sync:  # the slip: the forward ran outside, so DDP already expects to sync
                loss = model(x).pow(2).mean() / micro_batches
                with model.no_sync():
                    loss.backward()
            else:
                (model(x).pow(2).mean() / micro_batches).backward()
        results[mode] = {"all_reduces": counter["all_reduces"], "grads": [p.grad.cpu() for p in model.parameters()]}
    return results


def uneven_inputs(rank: int, world_size: int, use_join: bool = True, num_batches: int = 3,
                  collective_timeout: float = 60.0) -> dict:
    """Rank r has ``num_batches + r`` batches; the ranks that finish first go on to a ``barrier``.

    Without ``Join`` a rank with more batches waits in an all-reduce that no
    other rank joins: a hang, until DDP's group times out after
    ``collective_timeout`` seconds. gloo raises; NCCL's watchdog aborts the
    process instead (``hangs.expect("ddp_uneven_inputs", backend)`` says
    what each shows). ``Join`` lets finished ranks shadow the missing
    all-reduces until everyone is done, on either backend.
    """
    device = rank_device()
    import torch._dynamo  # noqa: F401  DDP imports it (seconds); here, before the short timeout applies
    dist.barrier()
    # DDP gets its own group: its timeout is how long a rank waits for a partner that never comes.
    group = dist.new_group(timeout=timedelta(seconds=collective_timeout))
    torch.manual_seed(0)
    model = wrap(ToyModel(), device, process_group=group)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(rank)
    steps = 0
    with Join([model]) if use_join else contextlib.nullcontext():
        for _ in range(num_batches + rank):
            optimizer.zero_grad()
            model(torch.randn(4, 10, generator=g).to(device)).pow(2).mean().backward()
            optimizer.step()
            steps += 1
    print(f"rank {rank} finished its {steps} batches")
    dist.barrier()  # end of the epoch, on the default group
    weights = {k: v.detach().cpu() for k, v in model.module.state_dict().items()}
    return {"steps": steps, "checksum": checksum(model.module), "weights": weights}


def uneven_reference(world_size: int, num_batches: int = 3, lr: float = 0.1, *,
                     divisor: str = "world") -> dict[str, torch.Tensor]:
    """``uneven_inputs`` under ``Join`` replayed in one process, as a reference for its final weights.

    Step ``s`` sums the gradients of the ranks that still have a batch ``s`` (a joined rank
    adds zeros) and divides by ``divisor``: ``"world"``, Join's default, or ``"active"``
    (the ranks still training), the rule Join does *not* follow.
    """
    torch.manual_seed(0)
    model = ToyModel()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    gens = [torch.Generator().manual_seed(rank) for rank in range(world_size)]
    batches = [[torch.randn(4, 10, generator=gens[r]) for _ in range(num_batches + r)] for r in range(world_size)]
    for step in range(num_batches + world_size - 1):
        active = [r for r in range(world_size) if step < len(batches[r])]
        optimizer.zero_grad()
        total = sum(model(batches[r][step]).pow(2).mean() for r in active)
        (total / (world_size if divisor == "world" else len(active))).backward()
        optimizer.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


# ----------------------------------------------------------------- the classic mp.spawn recipe


def mp_spawn_worker(rank: int, world_size: int, port: int, num_steps: int) -> None:
    """What ``mp.spawn`` runs as ``fn(i, *args)``: the set-up ``launch.spawn`` does for us, written out."""
    # mp.spawn starts every process on this one node, so the global rank is also the local rank.
    os.environ.update(MASTER_ADDR=LOCALHOST, MASTER_PORT=str(port), LOCAL_RANK=str(rank))
    backend = choose_backend(local_world_size=world_size)
    set_device_for(rank, backend)
    dist.init_process_group(backend, rank=rank, world_size=world_size)
    try:
        result = toy_example(rank, world_size, num_steps)
        if rank == 0:
            print(f"{world_size} ranks, {backend}: final weights checksum {result['checksum']:.6f}")
    finally:
        gc.collect()  # free the DDP model (it sits in reference cycles) while the group still exists
        dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description="DDP ToyModel example, started by mp.spawn or torchrun")
    parser.add_argument("--world-size", type=int, default=2, help="processes for mp.spawn (ignored under torchrun)")
    parser.add_argument("--num-steps", type=int, default=5)
    args = parser.parse_args()
    if launched_by_torchrun():
        with distributed() as (info, _device_):
            result = toy_example(info.rank, info.world_size, args.num_steps)
            if info.is_main:
                print(f"{info.world_size} ranks, {dist.get_backend()}: final weights checksum {result['checksum']:.6f}")
        return
    # The port is picked just before the children bind it; launch.spawn avoids even that small race.
    mp.spawn(mp_spawn_worker, args=(args.world_size, free_port(), args.num_steps), nprocs=args.world_size, join=True)


if __name__ == "__main__":
    main()
