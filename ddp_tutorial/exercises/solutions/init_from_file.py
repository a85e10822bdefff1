"""Exercise 2.1, reference solution: join the default group through a ``file://`` store.

The file is the rendezvous: the first rank creates it, every rank writes its address
into it and reads the others'. No port and no ``MASTER_ADDR`` are needed, only a path
that every rank can see (one machine, or a shared file system).
"""

from __future__ import annotations

from pathlib import Path

import torch.distributed as dist

from ddp_tutorial.env import bound_device, choose_backend, set_device_for


def init_from_file(rank: int, world_size: int, path: str) -> None:
    """Join the default process group as ``rank`` of ``world_size``, meeting through the file ``path``.

    Every rank is given the same ``path``, a file that does not exist yet. Call
    ``dist.init_process_group`` with the ``file://`` init method: ``init_method`` is
    the file's URL (``Path(path).absolute().as_uri()``), and ``rank`` and
    ``world_size`` are passed in. Any backend that can serve this machine will do:
    ``ddp_tutorial.env.choose_backend`` picks gloo on a CPU and nccl when every rank
    has a GPU (then make the rank's GPU current first: ``env.set_device_for``).
    Return nothing: the checker uses the group afterwards, then destroys it.
    """
    backend = choose_backend(local_world_size=world_size)
    device = set_device_for(rank, backend)  # on a GPU: this rank's device, current before init
    dist.init_process_group(backend, init_method=Path(path).absolute().as_uri(), rank=rank,
                            world_size=world_size, device_id=bound_device(device))
