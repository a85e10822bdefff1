"""Exercise 10.1, reference solution: ToyModel cut in two, one half per device.

``Module.to`` moves a module's parameters in place, so the model the caller holds is the
split one, and its optimizer (built on the same parameter objects) still works. The forward
pass copies the input to the first device and the hidden activation to the second: that
copy is the only communication of in-process model parallelism. ``Tensor.to`` is
differentiable, so backward copies the gradient back across the same boundary and the
first half is trained as before; a ``.detach()`` or ``.data`` there would cut it off.
``ToyMpModel`` in ``ddp_tutorial/pipeline_parallel/model_parallel.py`` is the same split as a class.
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
    dev0, dev1 = torch.device(devices[0]), torch.device(devices[1])
    model.net1.to(dev0)
    model.net2.to(dev1)
    hidden = model.relu(model.net1(x.to(dev0)))
    return model.net2(hidden.to(dev1))
