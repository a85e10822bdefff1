"""The image classifiers of lesson 11 (``11_train_end_to_end``) and ``build_model``, the registry behind
``python -m ddp_tutorial.training.train --model``.
"""

from __future__ import annotations

import torch
from torch import nn


class SmallCNN(nn.Module):
    """Two convolutions and two linear layers: the ``--model cnn`` of ``11_train_end_to_end``.

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
    """The ``--model`` of ``python -m ddp_tutorial.training.train``; unknown names raise ``ValueError``."""
    if name == "cnn":
        return SmallCNN(in_channels, num_classes)
    if name == "resnet18":
        return resnet18_small(in_channels, num_classes)
    raise ValueError(f"unknown model {name!r}; choose one of {', '.join(TRAIN_MODELS)}")
