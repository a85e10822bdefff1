"""Small models of the data-parallel lessons and their registry by name (``make_model``).

``ToyModel`` is the classic DDP example (``07_ddp_spawn``); ``DeepMLP`` and ``SharedLayerNet`` are
the performance and pitfall lessons' models.
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


class DeepMLP(nn.Module):
    """A stack of Linear + ReLU layers; the defaults hold about 1M parameters (``08_ddp_from_scratch``).

    Many equal layers make many gradients that become ready one after another
    during backward, which is what gradient bucketing works with.
    """

    def __init__(self, in_features: int = 256, hidden: int = 512, depth: int = 4, out_features: int = 10):
        super().__init__()
        sizes = [in_features] + [hidden] * depth + [in_features, out_features]
        layers: list[nn.Module] = []
        for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
            layers.append(nn.Linear(a, b))
            if i < len(sizes) - 2:
                layers.append(nn.ReLU())
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class SharedLayerNet(nn.Module):
    """One Linear used twice per forward, plus BatchNorm buffers (``08_ddp_from_scratch`` tests).

    The shared weight gets two gradient contributions in one backward; the
    BatchNorm running statistics are buffers that DDP keeps equal by broadcast.
    """

    def __init__(self, features: int = 8, out_features: int = 2):
        super().__init__()
        self.shared = nn.Linear(features, features)
        self.norm = nn.BatchNorm1d(features)
        self.head = nn.Linear(features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.shared(x))
        h = torch.tanh(self.shared(self.norm(h)))
        return self.head(h)


def make_model(name: str, seed: int, dtype: torch.dtype = torch.float32) -> tuple[nn.Module, tuple[int, int]]:
    """A model by name and its (in, out) features: ``toy``, ``shared`` (a layer used twice + BatchNorm), ``mlp`` (small), ``big`` (~1M, deep)."""
    makers = {
        "toy": lambda: (ToyModel(), (10, 5)),
        "shared": lambda: (SharedLayerNet(), (8, 2)),
        "mlp": lambda: (DeepMLP(16, 32, 3, 4), (16, 4)),
        "big": lambda: (DeepMLP(128, 256, 14, 10), (128, 10)),  # 0.92M parameters in 32 tensors
    }
    if name not in makers:
        raise ValueError(f"unknown model {name!r}; choose one of {', '.join(makers)}")
    torch.manual_seed(seed)
    model, shape = makers[name]()
    return model.to(dtype), shape
