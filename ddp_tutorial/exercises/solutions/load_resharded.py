"""Exercise 18.2, reference solution: load a DCP checkpoint saved on N ranks into a model sharded over M.

``get_model_state_dict`` and ``get_optimizer_state_dict`` give state dicts keyed by the
parameters' names whose values are this rank's shards *as the model is sharded now* (on M
ranks); a fresh Adam gets its state's shapes (zeros) first, so there is something to load
into. ``dcp.load`` fills them in place: each rank reads, from the checkpoint's metadata, the
byte ranges of the saved N-rank shards that overlap its new shards, and nothing else. The
``set_*`` functions then put the values into the model and the optimizer (the optimizer's
hyperparameters, ``lr`` and the rest, are no tensors: they arrive only this way). No rank
ever holds a whole tensor, and no collective of the learner's own is needed.
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
    # Shards as this world holds them, keyed by name; Adam's state shapes appear here (zeros)
    state = {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, optimizer)}
    dcp.load(state, checkpoint_id=path)  # in place: each rank reads the byte ranges of its own shards
    set_model_state_dict(model, state["model"])
    set_optimizer_state_dict(model, optimizer, state["optim"])  # the tensors and the lr
