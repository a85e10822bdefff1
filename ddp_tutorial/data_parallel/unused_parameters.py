"""A parameter that gets no gradient: DDP's "Expected to have finished reduction" error (``07_ddp_spawn``).

DDP all-reduces a bucket once the gradient of every parameter in it is ready. A
parameter that the forward never used gets no gradient, so its bucket never fills:
in the first step nothing in that bucket is all-reduced (each rank steps with its own
gradients, silently), and the next forward finds the previous reduction unfinished
and raises "Expected to have finished reduction in the prior iteration". The ways out:

- no unused parameters: delete the branch, or freeze it (``requires_grad_(False)``
  before wrapping: DDP only handles parameters that require gradients);
- ``find_unused_parameters=True``: after every forward DDP walks the autograd graph
  from the outputs and marks what it cannot reach as ready (a cost on every step);
- ``static_graph=True``: the set of used parameters never changes, so DDP learns it
  in the first step.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from ddp_tutorial.data_parallel.ddp_spawn import checksum, counting_allreduce_hook
from ddp_tutorial.env import rank_device

__all__ = ["BranchyNet", "FIXES", "train_branchy", "train_branchy_single", "branchy_batch"]

# The ways to wrap BranchyNet: the keyword arguments DDP gets, and whether the branch is frozen.
FIXES = {
    "none": ({}, False),
    "find_unused_parameters=True": ({"find_unused_parameters": True}, False),
    "static_graph=True": ({"static_graph": True}, False),
    "aux frozen": ({}, True),
}


class BranchyNet(nn.Module):
    """A trunk and two heads, of which forward uses only ``head``: ``aux`` never gets a gradient."""

    def __init__(self):
        super().__init__()
        self.trunk = nn.Linear(8, 16)
        self.head = nn.Linear(16, 2)
        self.aux = nn.Linear(16, 2)  # e.g. an auxiliary loss's head, left in the model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.trunk(x)))


def branchy_batch(rank: int, step: int, batch_size: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s batch for ``step`` (the same on any machine), float64."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    return (torch.randn(batch_size, 8, generator=g, dtype=torch.float64),
            torch.randn(batch_size, 2, generator=g, dtype=torch.float64))


def train_branchy(rank: int, world_size: int, fix: str = "none", num_steps: int = 3, lr: float = 0.1) -> dict:
    """``num_steps`` SGD steps of BranchyNet under DDP, wrapped as ``fix`` says (see ``FIXES``).

    Returns the all-reduces DDP issued in each step that finished, the error (step and
    message) if a step raised, and the weights of the parts that train.
    """
    kwargs, freeze = FIXES[fix]
    device = rank_device()
    torch.manual_seed(0)
    model = BranchyNet().double().to(device)
    if freeze:
        model.aux.requires_grad_(False)  # before wrapping: DDP leaves it out
    ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None, **kwargs)
    counter = {"all_reduces": 0}
    ddp.register_comm_hook(counter, counting_allreduce_hook)
    optimizer = torch.optim.SGD([p for p in ddp.parameters() if p.requires_grad], lr=lr)
    all_reduces, error = [], None
    for step in range(1, num_steps + 1):
        x, y = (t.to(device) for t in branchy_batch(rank, step))
        before = counter["all_reduces"]
        try:
            optimizer.zero_grad()
            nn.functional.mse_loss(ddp(x), y).backward()
        except RuntimeError as exc:
            error = (step, f"{type(exc).__name__}: {exc}")
            break
        optimizer.step()
        all_reduces.append(counter["all_reduces"] - before)
    trained = {k: v.detach().cpu() for k, v in model.state_dict().items() if not k.startswith("aux.")}
    return {"all_reduces": all_reduces, "error": error, "state": trained,
            "checksum": checksum(nn.ModuleList([model.trunk, model.head]))}


def train_branchy_single(world_size: int, num_steps: int = 3, lr: float = 0.1) -> dict:
    """The reference, in one process: every step on the ranks' batches put together."""
    torch.manual_seed(0)
    model = BranchyNet().double()
    optimizer = torch.optim.SGD(list(model.trunk.parameters()) + list(model.head.parameters()), lr=lr)
    for step in range(1, num_steps + 1):
        batches = [branchy_batch(rank, step) for rank in range(world_size)]
        x, y = torch.cat([b[0] for b in batches]), torch.cat([b[1] for b in batches])
        optimizer.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    return {k: v.detach() for k, v in model.state_dict().items() if not k.startswith("aux.")}
