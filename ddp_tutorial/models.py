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


class DeepMLP(nn.Module):
    """A stack of Linear + ReLU layers; the defaults hold about 1M parameters (``07_ddp_from_scratch``).

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
    """One Linear used twice per forward, plus BatchNorm buffers (``07_ddp_from_scratch`` tests).

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


# --------------------------------------------------------- lesson 10 (train.py)


class SmallCNN(nn.Module):
    """Two convolutions and two linear layers: the ``--model cnn`` of ``10_train_end_to_end``.

    Reaches about 97% on sklearn's 8x8 digits in seconds on a CPU; the adaptive
    pooling lets the same model take larger images (FakeData 32x32).
    """

    def __init__(self, in_channels: int = 1, num_classes: int = 10, width: int = 16):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, width, 3, padding=1), nn.ReLU(),
            nn.Conv2d(width, 2 * width, 3, padding=1), nn.ReLU(),
            nn.MaxPool2d(2), nn.AdaptiveAvgPool2d(4))
        self.classifier = nn.Sequential(
            nn.Flatten(), nn.Linear(2 * width * 16, 64), nn.ReLU(), nn.Linear(64, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


def resnet18_small(in_channels: int = 3, num_classes: int = 10) -> nn.Module:
    """torchvision's ResNet-18 adapted to 32x32 inputs (CIFAR-10): a 3x3 stem, no max-pool.

    The ImageNet stem (7x7 stride 2, then a max-pool) would shrink a 32x32 image
    to 8x8 before the first block.
    """
    from torchvision.models import resnet18

    model = resnet18(weights=None, num_classes=num_classes)
    model.conv1 = nn.Conv2d(in_channels, 64, kernel_size=3, stride=1, padding=1, bias=False)
    model.maxpool = nn.Identity()
    return model


TRAIN_MODELS = ("cnn", "resnet18")


def build_model(name: str, in_channels: int, num_classes: int) -> nn.Module:
    """The ``--model`` of ``python -m ddp_tutorial.train``; unknown names raise ``ValueError``."""
    if name == "cnn":
        return SmallCNN(in_channels, num_classes)
    if name == "resnet18":
        return resnet18_small(in_channels, num_classes)
    raise ValueError(f"unknown model {name!r}; choose one of {', '.join(TRAIN_MODELS)}")
