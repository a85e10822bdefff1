"""Exercise 10.1 (warm-up), lesson 10_model_parallel_ddp.ipynb: split ToyModel across two devices.

Write split_forward() below (its docstring is the contract: what must hold), then check it:
    check("split_forward")                                 in the notebook
    python -m ddp_tutorial.exercises check split_forward   from a shell
The checker's ranks read this file afresh each time: an edit counts at once.
A hint: python -m ddp_tutorial.exercises show split_forward
Start again from the stub: python -m ddp_tutorial.exercises reset split_forward
"""

from __future__ import annotations

import torch
from torch import nn


def split_forward(model: nn.Module, x: torch.Tensor, devices: tuple[str, str]) -> torch.Tensor:
    """Put ``model.net1`` on ``devices[0]`` and ``model.net2`` on ``devices[1]``, run the forward pass.

    ``model`` is a ``ToyModel``: ``net1 -> relu -> net2``. Move the two linear layers in
    place (``model.net1.to(devices[0])``), send ``x`` to ``devices[0]``, compute
    ``relu(net1(x))`` there, send that hidden activation to ``devices[1]`` and return
    ``net2(hidden)``, which lives on ``devices[1]``. Keep the autograd graph whole: the
    checker calls ``backward()`` on the result and compares every parameter's gradient
    with the unsplit model's.
    """
    # Your code here; the checker calls split_forward(model, x, devices) on every rank.
    raise NotImplementedError(
        'exercise 10.1 (split_forward): not started yet, as expected for a fresh stub: '
        'my_exercises/split_forward.py still raises NotImplementedError. Next: write '
        'split_forward() there (its docstring is the contract, lesson 10_model_parallel_ddp.ipynb '
        "explains it, show('split_forward') gives hints), then check again")
