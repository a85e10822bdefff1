"""Offline datasets and the loaders each rank trains on (``11_train_end_to_end``, ``train``).

- ``digits``: scikit-learn's 1,797 real 8x8 handwritten digits, shipped with the
  package (no download), split into train/test with a fixed seed.
- ``cifar10``: torchvision's CIFAR-10 from ``--data-dir``. Downloading happens only
  with an explicit flag, by local rank 0 first while the other ranks wait.
- ``fake``: torchvision's ``FakeData`` (random images) for throughput runs.
- ``SlowDataset``: any of them with a wait per sample, standing in for reading files
  (``11_train_end_to_end`` times DataLoader workers on it).

Training data is split between ranks by ``DistributedSampler`` (call
``set_epoch`` every epoch); test data by ``shard_indices``, which never pads, so
every test sample is counted exactly once when metrics are all-reduced.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Subset, TensorDataset

from ddp_tutorial.env import local_rank

__all__ = ["DATASETS", "DataError", "DataSpec", "load_dataset", "digits", "cifar10", "fake", "SlowDataset",
           "shard_indices", "make_loaders"]

DATASETS = ("digits", "cifar10", "fake")
CIFAR_MEAN, CIFAR_STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)


class DataError(ValueError):
    """Bad data input (unknown dataset, missing directory, too large a batch): a one-line message."""


@dataclass
class DataSpec:
    """The two splits and the shape a model must accept."""

    train: Dataset
    test: Dataset
    in_channels: int
    image_size: int
    num_classes: int


def digits(seed: int = 0, test_fraction: float = 0.2) -> DataSpec:
    """sklearn's digits as float tensors in [0, 1], shape (1, 8, 8); the split depends only on ``seed``.

    Read from the file scikit-learn ships, as its ``load_digits`` reads it, without importing
    scikit-learn: that import costs every rank of every launch a second or more.
    """
    import gzip
    from importlib.util import find_spec

    import numpy as np

    sklearn = find_spec("sklearn")  # locates the package without running it
    if sklearn is None or not sklearn.submodule_search_locations:
        raise DataError("the digits dataset needs scikit-learn: pip install scikit-learn")
    path = os.path.join(list(sklearn.submodule_search_locations)[0], "datasets", "data", "digits.csv.gz")
    if os.path.exists(path):
        with gzip.open(path, mode="rt", encoding="utf-8") as rows:
            table = np.loadtxt(rows, delimiter=",")  # 64 pixels (0 to 16) and the label, a row per image
    else:  # a scikit-learn that keeps the file elsewhere: its own loader, at the import's cost
        from sklearn.datasets import load_digits

        bunch = load_digits()
        table = np.column_stack([bunch.data, bunch.target])
    images = torch.tensor(table[:, :-1].reshape(-1, 8, 8), dtype=torch.float32).unsqueeze(1) / 16.0
    labels = torch.tensor(table[:, -1].astype(int), dtype=torch.long)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))
    n_test = int(round(len(labels) * test_fraction))
    test, train = order[:n_test], order[n_test:]
    return DataSpec(TensorDataset(images[train], labels[train]),
                    TensorDataset(images[test], labels[test]), 1, 8, 10)


def fake(num_samples: int = 2048, image_size: int = 32, seed: int = 0) -> DataSpec:
    """Random 3 x image_size x image_size images with random labels (accuracy stays at chance)."""
    from torchvision.datasets import FakeData
    from torchvision.transforms import ToTensor

    def materialise(size: int, offset: int) -> TensorDataset:
        # FakeData draws every image through PIL on each access; turning it into tensors once
        # keeps the throughput benchmark about training, not image decoding.
        data = FakeData(size=size, image_size=(3, image_size, image_size), num_classes=10,
                        transform=ToTensor(), random_offset=offset)
        images, labels = zip(*(data[i] for i in range(size)))
        return TensorDataset(torch.stack(images), torch.tensor(labels, dtype=torch.long))

    n_test = max(1, num_samples // 8)
    return DataSpec(materialise(num_samples, seed), materialise(n_test, seed + num_samples),
                    3, image_size, 10)


def cifar10(data_dir: str | None, download: bool = False) -> DataSpec:
    """CIFAR-10 from ``data_dir`` with the usual crop/flip augmentation on the training split.

    With ``download``, local rank 0 fetches it first and the others wait for it; without,
    a missing or empty directory is a ``DataError`` saying what to do.
    """
    from torchvision import datasets, transforms

    if not data_dir:
        raise DataError("--dataset cifar10 needs --data-dir DIR (a folder holding cifar-10-batches-py)")
    if download:
        _download_on_rank0(data_dir)
    elif not os.path.isdir(data_dir):
        raise DataError(f"--data-dir {data_dir} does not exist (add --download to fetch CIFAR-10 into it)")
    elif not os.listdir(data_dir):
        raise DataError(f"--data-dir {data_dir} is empty (add --download to fetch CIFAR-10 into it)")
    normalise = transforms.Normalize(CIFAR_MEAN, CIFAR_STD)
    augment = transforms.Compose([transforms.RandomCrop(32, padding=4), transforms.RandomHorizontalFlip(),
                                  transforms.ToTensor(), normalise])
    plain = transforms.Compose([transforms.ToTensor(), normalise])
    try:
        train = datasets.CIFAR10(data_dir, train=True, transform=augment, download=False)
        test = datasets.CIFAR10(data_dir, train=False, transform=plain, download=False)
    except RuntimeError as exc:  # "Dataset not found or corrupted."
        raise DataError(f"no usable CIFAR-10 in {data_dir} ({exc}); expected {data_dir}/cifar-10-batches-py, "
                        "or add --download") from None
    return DataSpec(train, test, 3, 32, 10)


def _download_on_rank0(data_dir: str) -> None:
    """Local rank 0 of each node downloads (nodes rarely share a disk); the others wait for the verdict.

    The wait is an ``all_gather_object`` of error messages rather than a bare
    barrier, so a failed download stops every rank instead of leaving them waiting.
    """
    from torchvision import datasets

    distributed = dist.is_available() and dist.is_initialized()
    problem = ""
    if local_rank() == 0:
        try:
            os.makedirs(data_dir, exist_ok=True)
            datasets.CIFAR10(data_dir, train=True, download=True)
            datasets.CIFAR10(data_dir, train=False, download=True)
        except Exception as exc:  # no network, no space: report it, do not leave the others waiting
            problem = f"downloading CIFAR-10 into {data_dir} failed: {type(exc).__name__}: {exc}"
    if distributed:
        verdicts = [""] * dist.get_world_size()
        dist.all_gather_object(verdicts, problem)
        problem = problem or next((v for v in verdicts if v), "")
    if problem:
        raise DataError(problem)


class SlowDataset(Dataset):
    """``dataset`` with ``seconds`` of waiting in every ``__getitem__``: reading and decoding a file.

    Waiting on storage (or decoding on spare cores) is what DataLoader workers overlap with training.
    """

    def __init__(self, dataset: Dataset, seconds: float):
        self.dataset, self.seconds = dataset, seconds

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int):
        time.sleep(self.seconds)
        return self.dataset[index]


def load_dataset(name: str, *, data_dir: str | None = None, download: bool = False, seed: int = 0,
                 num_samples: int = 2048, image_size: int = 32) -> DataSpec:
    """One entry point for ``--dataset``; unknown names are a ``DataError``."""
    if name == "digits":
        return digits(seed)
    if name == "cifar10":
        return cifar10(data_dir, download)
    if name == "fake":
        return fake(num_samples, image_size, seed)
    raise DataError(f"unknown dataset {name!r}; choose one of {', '.join(DATASETS)}")


def shard_indices(n: int, rank: int, world_size: int) -> list[int]:
    """Rank ``rank``'s share of ``n`` test samples: strided, never padded (ranks may differ by one)."""
    return list(range(rank, n, world_size))


def make_loaders(spec: DataSpec, batch_size: int, rank: int, world_size: int, *, seed: int = 0,
                 workers: int = 0, pin_memory: bool = False) -> tuple[DataLoader, DataLoader]:
    """Training loader over this rank's ``DistributedSampler`` share; test loader over its unpadded shard.

    The sampler gives every rank ``ceil(N / world_size)`` training indices (repeating
    a few samples when N is not a multiple of ``world_size``), so every rank takes the
    same number of steps; ``drop_last`` only drops each rank's last partial batch, so
    every batch is full. A batch larger than a rank's share is a ``DataError``.
    """
    if batch_size < 1:
        raise DataError(f"--batch-size must be at least 1, got {batch_size}")
    sampler = DistributedSampler(spec.train, num_replicas=world_size, rank=rank, shuffle=True, seed=seed)
    per_rank = sampler.num_samples
    if batch_size > per_rank:
        raise DataError(f"--batch-size {batch_size} leaves each of the {world_size} rank(s) without a full "
                        f"batch: {len(spec.train)} training samples give {per_rank} per rank; "
                        f"use --batch-size {per_rank} or less")
    train = DataLoader(spec.train, batch_size=batch_size, sampler=sampler, drop_last=True,
                       num_workers=workers, pin_memory=pin_memory, persistent_workers=workers > 0)
    test_part = Subset(spec.test, shard_indices(len(spec.test), rank, world_size))
    test = DataLoader(test_part, batch_size=max(batch_size, 256), shuffle=False,
                      num_workers=workers, pin_memory=pin_memory)
    return train, test
