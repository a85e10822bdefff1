"""Exercise 2.1 (warm-up), lesson 02_process_groups.ipynb: join a group through a file:// store.

Write init_from_file() below (its docstring is the contract: what must hold), then check it:
    check("init_from_file")                                 in the notebook
    python -m ddp_tutorial.exercises check init_from_file   from a shell
The checker's ranks read this file afresh each time: an edit counts at once.
A hint: python -m ddp_tutorial.exercises show init_from_file
Start again from the stub: python -m ddp_tutorial.exercises reset init_from_file
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
    # Your code here; the checker calls init_from_file(rank, world_size, path) on every rank.
    raise NotImplementedError(
        'exercise 2.1 (init_from_file): not started yet, as expected for a fresh stub: '
        'my_exercises/init_from_file.py still raises NotImplementedError. Next: write '
        'init_from_file() there (its docstring is the contract, lesson 02_process_groups.ipynb '
        "explains it, show('init_from_file') gives hints), then check again")
