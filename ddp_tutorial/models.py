"""Models used across the lessons, small enough to train on a 2-core CPU.

``ToyModel`` is the classic DDP example (``06_ddp_spawn``); lessons add their
models here so that every lesson shares one definition.
"""

from __future__ import annotations

import torch
from torch import nn


class ToyModel(nn.Module):
    """Linear(10, 10) -> ReLU -> Linear(10, 5): the model of PyTorch's DDP tutorial."""

    def __init__(self, in_features: int = 10, hidden: int = 10, out_features: int = 5):
        super().__init__()
        self.net1 = nn.Linear(in_features, hidden)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(hidden, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net2(self.relu(self.net1(x)))
