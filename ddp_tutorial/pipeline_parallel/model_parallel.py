"""Model parallelism inside one process, wrapped by DDP (``10_model_parallel_ddp``).

A model too big for one device is split: its first half lives on ``dev0``, its
second half on ``dev1``, and the activations cross between them in ``forward``.
DDP then replicates that *two-device* model across processes, exactly as it
replicates a one-device model. Rank ``r`` of a node uses GPUs ``2r`` and
``2r + 1``; without enough GPUs both halves run on the CPU, so the same code runs
on a laptop and on an 8-GPU node. A rank touches only its own GPUs: it makes the
first one current before the process group (or anything else) uses CUDA, so it
sets the group up itself: ``spawn(ddp_mp_worker, 2, init_process_group=False)``.

    torchrun --nproc-per-node=2 -m ddp_tutorial.pipeline_parallel.model_parallel   # 2 ranks x 2 devices
    python -m ddp_tutorial.pipeline_parallel.model_parallel                         # one process, a world of one
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from ddp_tutorial.env import choose_backend, cuda_device_count, distributed, rank_info
from ddp_tutorial.launch.errors import UsageParser, check_world_size, exit_on_interrupt
from ddp_tutorial.models import ToyModel

__all__ = ["device_map", "model_parallel_backend", "model_parallel_plan", "ToyMpModel", "toy_batch",
           "ddp_mp_worker", "train_reference", "training_memory", "main"]

PROG = "python -m ddp_tutorial.pipeline_parallel.model_parallel"


def device_map(local_rank: int, local_world_size: int, cuda_devices: int,
               devices_per_rank: int = 2) -> tuple[torch.device, ...]:
    """The devices of ``local_rank``'s model halves: GPUs ``2r, 2r+1``, or the CPU twice without GPUs.

    Pure (the GPU count is an argument), so it is tested for any node size.
    Raises ``ValueError`` when the node cannot give every local rank its own GPUs.
    """
    if not 0 <= local_rank < local_world_size:
        raise ValueError(f"local_rank {local_rank} is not in range for local_world_size {local_world_size}")
    if cuda_devices == 0:
        return (torch.device("cpu"),) * devices_per_rank
    needed = devices_per_rank * local_world_size
    if cuda_devices < needed:
        raise ValueError(
            f"{local_world_size} process(es) x {devices_per_rank} devices need {needed} GPUs, this node "
            f"has {cuda_devices}: start at most {cuda_devices // devices_per_rank} process(es) per node "
            "(or hide the GPUs with CUDA_VISIBLE_DEVICES= to run on the CPU)")
    first = devices_per_rank * local_rank
    devices = tuple(torch.device("cuda", first + i) for i in range(devices_per_rank))
    # two ranks sharing a GPU would silently halve its memory and race for it
    assert devices[-1].index < cuda_devices
    return devices


def model_parallel_backend(local_world_size: int, cuda_devices: int | None = None,
                           devices_per_rank: int = 2, nccl_available: bool | None = None) -> str:
    """nccl when every local rank can have ``devices_per_rank`` GPUs of its own, else gloo."""
    if cuda_devices is None:
        cuda_devices = cuda_device_count()
    return choose_backend(cuda_devices // devices_per_rank, local_world_size, nccl_available)


def model_parallel_plan(local_rank: int, local_world_size: int, cuda_devices: int, devices_per_rank: int = 2,
                        nccl_available: bool | None = None) -> tuple[str, tuple[torch.device, ...]]:
    """The backend and ``local_rank``'s own devices (``10_model_parallel_ddp``); ``devices[0]`` becomes current.

    nccl and GPUs ``2r, 2r+1`` when every local rank can have two, else gloo and the CPU
    twice (with 3 GPUs and 2 ranks, too: a rank never borrows another rank's GPU).
    """
    backend = model_parallel_backend(local_world_size, cuda_devices, devices_per_rank, nccl_available)
    gpus = cuda_devices if backend == "nccl" else 0
    return backend, device_map(local_rank, local_world_size, gpus, devices_per_rank)


class ToyMpModel(nn.Module):
    """``ToyModel`` cut in two: ``net1 -> relu`` on ``dev0``, ``net2`` on ``dev1`` (``10_model_parallel_ddp``).

    The parameter names are ToyModel's, so ``load_state_dict`` moves weights between the two.
    """

    def __init__(self, dev0: torch.device | str, dev1: torch.device | str, in_features: int = 10,
                 hidden: int = 10, out_features: int = 5):
        super().__init__()
        self.dev0, self.dev1 = torch.device(dev0), torch.device(dev1)
        self.net1 = nn.Linear(in_features, hidden).to(self.dev0)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(hidden, out_features).to(self.dev1)

    def stage0(self, x: torch.Tensor) -> torch.Tensor:
        return self.relu(self.net1(x.to(self.dev0)))

    def stage1(self, h: torch.Tensor) -> torch.Tensor:
        # the only communication of in-process model parallelism: one device-to-device copy
        return self.net2(h.to(self.dev1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.stage1(self.stage0(x))


def toy_batch(step: int, batch_size: int, seed: int = 0, in_features: int = 10, out_features: int = 5,
              dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch of ``step``: the same on every rank, so each rank can take its own rows."""
    g = torch.Generator().manual_seed(seed * 100_003 + step)
    x = torch.randn(batch_size, in_features, generator=g, dtype=dtype)
    y = torch.randn(batch_size, out_features, generator=g, dtype=dtype)
    return x, y


def ddp_mp_worker(rank: int, world_size: int, num_steps: int = 3, lr: float = 0.1,
                  batch_size: int = 8, seed: int = 0) -> dict:
    """DDP around a two-device ToyMpModel: each rank trains on its ``batch_size`` rows of the global batch.

    Sets up its own group: start it with ``spawn(ddp_mp_worker, n, init_process_group=False)``
    or torchrun. Returns the rank's devices, the global mean loss of every step and the
    final weights (on the CPU).
    """
    if dist.is_initialized():  # the launcher already made cuda:local_rank current: another rank's GPU
        raise RuntimeError("ddp_mp_worker sets up its own process group, after making its first own GPU "
                           "current: start it with spawn(ddp_mp_worker, n, init_process_group=False)")
    info = rank_info()
    backend, (dev0, dev1) = model_parallel_plan(info.local_rank, info.local_world_size, cuda_device_count())
    # dev0 is made current before the group exists: NCCL's own work (barriers) goes there,
    # and no CUDA context opens on a GPU of another rank.
    with distributed(backend, device=dev0) as (info, _):
        torch.manual_seed(seed)  # same start everywhere; DDP would broadcast rank 0's anyway
        model = ToyMpModel(dev0, dev1).double()
        # No device_ids: they mean "replicate this one-device module on that device".
        # A module spanning devices is used as it is, and its output stays on dev1.
        ddp = DDP(model)
        optimizer = torch.optim.SGD(ddp.parameters(), lr=lr)
        losses = []
        for step in range(num_steps):
            x, y = toy_batch(step, batch_size * world_size, seed)
            rows = slice(rank * batch_size, (rank + 1) * batch_size)
            optimizer.zero_grad()
            out = ddp(x[rows])
            loss = nn.functional.mse_loss(out, y[rows].to(out.device))
            loss.backward()  # DDP averages the gradients on both devices over the ranks
            optimizer.step()
            total = loss.detach().clone()
            dist.all_reduce(total)
            losses.append(total.item() / world_size)
        return {"devices": [str(dev0), str(dev1)], "losses": losses,
                "state": {k: v.detach().cpu() for k, v in model.state_dict().items()}}


def train_reference(num_steps: int = 3, lr: float = 0.1, global_batch: int = 16,
                    seed: int = 0) -> dict:
    """One process, one device, the unsplit ToyModel on the whole global batch: what DDP must match."""
    torch.manual_seed(seed)
    model = ToyModel().double()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for step in range(num_steps):
        x, y = toy_batch(step, global_batch, seed)
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return {"losses": losses, "state": {k: v.detach().clone() for k, v in model.state_dict().items()}}


def training_memory(num_params: float, world_size: int, strategy: str, bytes_per_value: int = 4,
                    optimizer_values: int = 2, num_stages: int = 1) -> dict:
    """Bytes per rank for parameters, gradients and optimizer state (Adam keeps 2 values per parameter).

    ``ddp``: everything replicated. ``pipeline``: each rank holds 1/num_stages of the model.
    ``fsdp``: everything sharded over ``world_size`` (ZeRO-3). Activations come on top.
    """
    share = {"ddp": 1, "pipeline": num_stages, "fsdp": world_size}
    if strategy not in share:
        raise ValueError(f"strategy must be one of {sorted(share)}, got {strategy!r}")
    per_rank = num_params / share[strategy]
    params = per_rank * bytes_per_value
    grads = per_rank * bytes_per_value
    optim = per_rank * bytes_per_value * optimizer_values
    return {"params": params, "grads": grads, "optimizer": optim, "total": params + grads + optim}


def main(argv: list[str] | None = None) -> None:
    parser = UsageParser(prog=PROG, description=__doc__.splitlines()[0])
    parser.add_argument("--num-steps", type=int, default=3)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--batch-size", type=int, default=8, help="rows per rank and step")
    args = parser.parse_args(argv)
    for option, value in (("--num-steps", args.num_steps), ("--batch-size", args.batch_size)):
        if value < 1:
            parser.error(f"{option} must be at least 1, got {value}")
    if not (math.isfinite(args.lr) and args.lr >= 0):
        parser.error(f"--lr must be a finite number of at least 0, got {args.lr}")
    # Every rank of a node would refuse too few GPUs alike: said once, from torchrun's environment, before any group.
    check_world_size(PROG, lambda _: model_parallel_plan(rank_info().local_rank, rank_info().local_world_size,
                                                         cuda_device_count()))
    info = rank_info()
    with exit_on_interrupt(PROG, "nothing was saved; run it again"):
        result = ddp_mp_worker(info.rank, info.world_size, args.num_steps, args.lr, args.batch_size)
    if info.is_main:
        world_size = info.world_size
        ref = train_reference(args.num_steps, args.lr, args.batch_size * world_size)
        same = all(torch.allclose(result["state"][k], v, atol=1e-6) for k, v in ref["state"].items())
        print(f"rank 0 devices {result['devices']}, losses {[round(v, 4) for v in result['losses']]}")
        print(f"DDP over {world_size} two-device replica(s) equals one-process training: {same}")

if __name__ == "__main__":
    main()
