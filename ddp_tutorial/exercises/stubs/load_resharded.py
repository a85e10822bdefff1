"""Exercise 18.2 (medium), lesson 18_zero3_and_checkpoints.ipynb: a resharding load: a DCP checkpoint saved on 4 ranks, loaded on 1, 2 and 3.

Write load_resharded() below (its docstring is the contract: what must hold), then check it:
    check("load_resharded")                                 in the notebook
    python -m ddp_tutorial.exercises check load_resharded   from a shell
The checker's ranks read this file afresh each time: an edit counts at once.
Hints, one at a time: python -m ddp_tutorial.exercises show load_resharded [--hint 2 .. 2]
Start again from the stub: python -m ddp_tutorial.exercises reset load_resharded
"""

from __future__ import annotations

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)


def load_resharded(model: nn.Module, optimizer: torch.optim.Optimizer, path: str) -> None:
    """Load the DCP checkpoint in the folder ``path`` into ``model`` and ``optimizer``, on every rank.

    The checkpoint was saved by another number of ranks (4) as
    ``dcp.save({"model": get_model_state_dict(m), "optim": get_optimizer_state_dict(m, opt)}, ...)``
    (``sharding.sharded_checkpoint.train_and_save``). ``model`` is sharded with FSDP2 over
    this world (1, 2 or 3 ranks: on 3 each tensor's dim-0 shards are uneven, 32 rows as 11, 11
    and 10), ``optimizer`` a fresh Adam over its parameters. Afterwards:
    - every parameter, gathered, equals the saved one bit for bit, and so does Adam's state
      (``exp_avg``, ``exp_avg_sq``, ``step``) and its ``lr`` (the checkpoint's, not the
      optimizer's own);
    - no rank held a whole tensor on the way: each rank read only its new shards (no
      ``torch.load`` of a single-file export, no rank 0 that loads and broadcasts), and the
      values went back through ``set_model_state_dict`` / ``set_optimizer_state_dict``.
    Hints: ``show("load_resharded", hint=1)``, then 2.
    """
    # Your code here; the checker calls load_resharded(model, optimizer, path) on every rank.
    raise NotImplementedError(
        'exercise 18.2 (load_resharded): not started yet, as expected for a fresh stub: '
        'my_exercises/load_resharded.py still raises NotImplementedError. Next: write '
        'load_resharded() there (its docstring is the contract, lesson '
        "18_zero3_and_checkpoints.ipynb explains it, show('load_resharded') gives hints), then "
        'check again')
