"""Reproducible training: one seed for every rank, and deterministic kernels where they matter.

Used by ``train`` (``11_train_end_to_end`` shows ``seed_everything``; ``09_torchrun``
and ``10`` compare runs bitwise). Every switch is set both ways, so a call with
``deterministic=False`` undoes an earlier ``True``; the choices are pure functions,
tested without a GPU.
"""

from __future__ import annotations

import os
import random

import torch

__all__ = ["seed_everything", "determinism_switches", "deterministic_for"]


def deterministic_for(requested: bool | None, device_type: str) -> bool:
    """``--deterministic`` as asked; unset (None), deterministic exactly when training on a GPU.

    The lessons compare GPU runs bitwise (09: a restarted job, 11: a resumed one); on the
    CPU the kernels used here are deterministic already, so nothing needs switching.
    """
    return device_type == "cuda" if requested is None else requested


def determinism_switches(deterministic: bool, cuda: bool) -> dict[str, object]:
    """The global switches ``seed_everything`` sets, each set both ways (``11_train_end_to_end``).

    Pure, so the choice is tested without a GPU. ``CUBLAS_WORKSPACE_CONFIG`` None: left alone.
    """
    return {
        # benchmark times several convolution algorithms and keeps the fastest: the choice,
        # and so the rounding, can change between runs
        "cudnn.benchmark": not deterministic,
        "cudnn.deterministic": deterministic,
        "deterministic_algorithms": deterministic,
        # warn, not fail: AdaptiveAvgPool2d (SmallCNN, ResNet-18) has no deterministic CUDA backward.
        # It adds with atomics, but its bins do not overlap when the pooled size is a multiple of
        # the output size (digits' 8x8, 32x32 images), so each gradient element gets one addition
        # and runs still repeat bitwise.
        "warn_only": True,
        # deterministic cuBLAS needs a fixed workspace; read when cuBLAS first runs
        "CUBLAS_WORKSPACE_CONFIG": ":4096:8" if deterministic and cuda else None,
    }


def seed_everything(seed: int, deterministic: bool = False, cuda: bool | None = None) -> None:
    """Same seed on every rank (identical initial weights), and deterministic kernels or fast ones.

    ``deterministic=False`` undoes an earlier ``True`` (``determinism_switches``).
    ``cuda``: whether CUDA will run (default: whether this process sees a GPU).
    """
    random.seed(seed)
    torch.manual_seed(seed)
    switches = determinism_switches(deterministic, torch.cuda.is_available() if cuda is None else cuda)
    torch.backends.cudnn.benchmark = switches["cudnn.benchmark"]
    torch.backends.cudnn.deterministic = switches["cudnn.deterministic"]
    if switches["deterministic_algorithms"] or torch.are_deterministic_algorithms_enabled():
        # torch's setter also imports the compiler's settings (seconds in a new process): skip it
        # where the switch is off and stays off
        torch.use_deterministic_algorithms(switches["deterministic_algorithms"], warn_only=switches["warn_only"])
    if switches["CUBLAS_WORKSPACE_CONFIG"]:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", switches["CUBLAS_WORKSPACE_CONFIG"])
