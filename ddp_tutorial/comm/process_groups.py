"""Process groups: how ranks find each other, sub-groups, barrier, timeouts, tear-down.

Used by ``02_process_groups``. Every function with the signature
``(rank, world_size, ...)`` is a worker for ``launch.spawn``; most of them set up
the group themselves (``spawn(..., init_process_group=False)``) because setting
it up is the lesson. ``gpu_setup`` is the GPU rule for one rank, with device counts
as arguments. Starting ranks without ``launch.spawn`` (``multiprocessing.Process``,
``mp.spawn``) and the start methods are in ``start_methods``. From a shell:

    torchrun --nproc-per-node=2 -m ddp_tutorial.comm.process_groups
    python -m ddp_tutorial.comm.process_groups          # one process: a world of one
"""

from __future__ import annotations

import os
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from ddp_tutorial.env import (
    bound_device,
    choose_backend,
    choose_device,
    distributed,
    local_rank,
    rank_device,
    set_device_for,
)

INIT_METHODS = ("env", "tcp", "file")
# What the env:// rendezvous reads when rank and world_size are not passed in.
INIT_VARIABLES = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")


def init_url(method: str, file_path: str | os.PathLike | None = None) -> str:
    """The ``init_method`` URL for ``"env"``, ``"tcp"`` or ``"file"`` (``file`` needs ``file_path``)."""
    if method == "env":
        return "env://"  # MASTER_ADDR, MASTER_PORT (and RANK, WORLD_SIZE) from the environment
    if method == "tcp":
        return f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
    if method == "file":
        if file_path is None:
            raise ValueError("the file:// init method needs a path that every rank can see")
        return Path(file_path).absolute().as_uri()
    raise ValueError(f"unknown init method {method!r}; choose one of {INIT_METHODS}")


def join_with(rank: int, world_size: int, method: str, file_path: str | None = None,
              backend: str | None = None) -> dict:
    """Join the default group with one init method, all-reduce ``rank + 1``, leave."""
    backend = backend or choose_backend(local_world_size=world_size)
    device = set_device_for(local_rank(), backend)  # on GPUs: this rank's GPU, current before init
    dist.init_process_group(backend, init_method=init_url(method, file_path),
                            rank=rank, world_size=world_size, device_id=bound_device(device))
    try:
        x = torch.tensor([rank + 1.0], device=device)
        dist.all_reduce(x)
        return {"rank": dist.get_rank(), "world_size": dist.get_world_size(),
                "backend": dist.get_backend(), "init_method": method, "sum": x.item()}
    finally:
        dist.destroy_process_group()


def without_a_backend(rank: int, world_size: int) -> dict:
    """``init_process_group()`` with no backend: torch registers the one for the machine's accelerator.

    Returns the device type torch detected (``"cpu"`` without one) and what the group
    says about its backend. torch looks at the kind of accelerator, not at how many
    there are: ``env.choose_backend`` also counts GPUs per rank.
    """
    accelerator = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None
    if accelerator is not None and accelerator.type == "cuda":
        torch.cuda.set_device(local_rank())  # before init, as always on a GPU
    dist.init_process_group(rank=rank, world_size=world_size)  # env://; no backend named
    try:
        return {"device": "cpu" if accelerator is None else accelerator.type,
                "backend_config": dist.get_backend_config(), "get_backend": dist.get_backend()}
    finally:
        dist.destroy_process_group()


def gpu_setup(local_rank: int, local_world_size: int, cuda_devices: int, nccl_available: bool = True) -> dict:
    """What a rank sets up before ``init_process_group``, on a node with ``cuda_devices`` GPUs.

    The course's rule (``env``): the backend; the device the rank's tensors live on;
    the device made current with ``torch.cuda.set_device`` (``set_device_for``), None
    on the CPU; and the ``device_id`` the group is bound to (``bound_device``).
    """
    backend = choose_backend(cuda_devices, local_world_size, nccl_available=nccl_available)
    device = choose_device(local_rank, backend, cuda_devices=cuda_devices)
    current = device if device.type == "cuda" else None
    return {"backend": backend, "device": device, "set_device": current, "device_id": bound_device(device)}


def what_init_needs(rank: int, world_size: int) -> dict[str, str]:
    """Call ``init_process_group("gloo")`` (env://) with one variable missing at a time.

    Returns ``{variable: first line of the error}``. Nothing connects: each
    attempt fails while reading the environment.
    """
    errors = {}
    for name in INIT_VARIABLES:
        saved = os.environ.pop(name)
        try:
            dist.init_process_group("gloo", timeout=timedelta(seconds=5))
            dist.destroy_process_group()
            errors[name] = "(no error)"
        except (ValueError, RuntimeError) as err:
            errors[name] = str(err).splitlines()[0]
        finally:
            os.environ[name] = saved
    return errors


def subgroup_sums(rank: int, world_size: int) -> dict:
    """Split the world into even and odd ranks with ``new_group``; all-reduce in each."""
    # new_group is collective: every rank creates every group, even ones it is not in.
    evens = dist.new_group(list(range(0, world_size, 2)))
    odds = dist.new_group(list(range(1, world_size, 2))) if world_size > 1 else None
    mine = evens if rank % 2 == 0 else odds
    device = rank_device()  # sub-groups share the default group's backend: NCCL wants GPU tensors
    in_group = torch.tensor([float(rank)], device=device)
    dist.all_reduce(in_group, group=mine)
    in_world = torch.tensor([float(rank)], device=device)
    dist.all_reduce(in_world)  # group=None: the default group, all ranks
    return {"rank": rank, "group": "even" if rank % 2 == 0 else "odd",
            "group_rank": dist.get_rank(mine), "group_size": dist.get_world_size(mine),
            "members": dist.get_process_group_ranks(mine),
            "group_sum": in_group.item(), "world_sum": in_world.item()}


def prepare_then_read(rank: int, world_size: int, path: str, use_barrier: bool,
                      delay: float = 1.0) -> str | None:
    """Rank 0 slowly writes ``path`` (think: downloads a data set); every rank then reads it.

    Returns what the rank found, or None. Without the barrier nothing orders rank 0's write
    and the others' read. So that the demo shows the early look on any machine, however
    loaded, rank 0 then also waits (on the store) until the others have looked.
    """
    target = Path(path)
    store = None
    if not use_barrier:  # a client of the launcher's store, only to order the demo
        store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                              world_size, is_master=False, timeout=timedelta(seconds=60))
    if rank == 0:
        if store is not None:
            store.wait([f"prepare_then_read/looked/{r}" for r in range(1, world_size)])
        time.sleep(delay)  # the slow, do-it-once work
        tmp = target.with_suffix(".tmp")
        tmp.write_text("prepared by rank 0")
        os.replace(tmp, target)  # atomic: a reader sees no file or the whole file
    if use_barrier:
        dist.barrier()  # nobody passes until every rank, rank 0 included, got here
    found = target.read_text() if target.exists() else None
    if store is not None and rank != 0:
        store.set(f"prepare_then_read/looked/{rank}", "yes")
    return found


def missed_collective(rank: int, world_size: int, timeout: float = 2.0) -> dict:
    """Rank 0 calls ``all_reduce``; the others never do. Rank 0 gives up after ``timeout`` s.

    Uses gloo, which raises on a timeout (NCCL's watchdog aborts the process
    instead). The others wait on the store, not in a collective, until rank 0
    has given up, so rank 0 sees a timeout and not a closed connection.
    """
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                          world_size, is_master=False, timeout=timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size)
    # Every group has its own timeout. Meeting may take a while on a busy machine,
    # so the short limit goes to a second group made for the collective.
    group = dist.new_group(timeout=timedelta(seconds=timeout))
    try:
        if rank != 0:
            store.wait(["rank0_gave_up"])
            return {"rank": rank, "outcome": "never called all_reduce"}
        start = time.monotonic()
        try:
            dist.all_reduce(torch.ones(1), group=group)
            outcome = "all_reduce finished"
        except RuntimeError as err:  # DistBackendError is a RuntimeError
            outcome = f"{type(err).__name__}: timed out" if "Timed out" in str(err) else str(err)
        waited = time.monotonic() - start
        store.set("rank0_gave_up", "1")
        return {"rank": rank, "outcome": outcome, "waited >= timeout": waited >= timeout}
    finally:
        dist.destroy_process_group()


def lifecycle(rank: int, world_size: int) -> list[tuple[str, str]]:
    """``is_initialized`` before ``init_process_group``, after it, after ``destroy_process_group``."""
    steps = [("before init", f"is_initialized={dist.is_initialized()}")]
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    steps.append(("after init", f"is_initialized={dist.is_initialized()}, "
                                f"world_size={dist.get_world_size()}"))
    dist.barrier()  # nobody leaves while another rank still uses the group
    dist.destroy_process_group()
    steps.append(("after destroy", f"is_initialized={dist.is_initialized()}"))
    try:
        dist.all_reduce(torch.ones(1))
        steps.append(("all_reduce after destroy", "worked"))
    except (ValueError, RuntimeError) as err:
        steps.append(("all_reduce after destroy", f"{type(err).__name__}: {str(err).splitlines()[0]}"))
    return steps


def main() -> None:
    with distributed() as (info, _device):
        print(f"rank {info.rank} of {info.world_size} on {dist.get_backend()}")
        if info.world_size > 1:
            result = subgroup_sums(info.rank, info.world_size)
            print(f"rank {info.rank}: {result['group']} group {result['members']}, "
                  f"sum {result['group_sum']:.0f}; world sum {result['world_sum']:.0f}")
        dist.barrier()
        if info.is_main:
            print("process groups: OK")


if __name__ == "__main__":
    main()
