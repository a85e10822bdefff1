"""``python -m ddp_tutorial``: check that this machine can run the course, and say what to do if not.

Prints versions, the distributed backends torch was built with, the devices,
the backend the lessons will choose, and runs a timed 2-rank all-reduce through
``launch.spawn``. Exit code 0 when everything needed works. ``00_start_here``
runs it first.
"""

from __future__ import annotations

import argparse
import importlib
import os
import platform
import sys
import time

OPTIONAL = ["torchvision", "matplotlib", "sklearn", "tqdm", "nbval", "ipykernel"]


def versions() -> dict[str, str]:
    """Versions of python, torch and the optional packages ('missing' when absent)."""
    import torch

    found = {"python": platform.python_version(), "torch": torch.__version__}
    for name in OPTIONAL:
        try:
            found[name] = getattr(importlib.import_module(name), "__version__", "installed")
        except ImportError:
            found[name] = "missing"
    return found


def backends() -> dict[str, bool]:
    import torch.distributed as dist

    return {"distributed": dist.is_available(),
            "gloo": dist.is_available() and dist.is_gloo_available(),
            "nccl": dist.is_available() and dist.is_nccl_available(),
            "mpi": dist.is_available() and dist.is_mpi_available()}


def devices() -> dict[str, object]:
    import torch

    cuda = torch.cuda.is_available()
    return {"cpu cores": os.cpu_count(),
            "cuda available": cuda,
            "cuda devices": torch.cuda.device_count() if cuda else 0,
            "gpu names": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if cuda else []}


def check_all_reduce(world_size: int = 2, timeout: float = 60.0) -> float:
    """Run the hello all-reduce on ``world_size`` ranks; return the warm launch time in seconds."""
    from ddp_tutorial.hello import all_reduce_ranks
    from ddp_tutorial.launch import spawn

    expected = [world_size * (world_size - 1) / 2] * world_size
    spawn(all_reduce_ranks, world_size, quiet=True, timeout=timeout)  # start the forkserver
    start = time.perf_counter()
    results = spawn(all_reduce_ranks, world_size, quiet=True, timeout=timeout)
    elapsed = time.perf_counter() - start
    if results != expected:
        raise RuntimeError(f"all_reduce returned {results}, expected {expected}")
    return elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ddp_tutorial", description=__doc__.split("\n")[0])
    parser.add_argument("--world-size", type=int, default=2, help="ranks for the all-reduce check")
    args = parser.parse_args(argv)
    if args.world_size < 1:
        parser.error("--world-size must be >= 1")

    from ddp_tutorial.env import choose_backend

    problems = []
    print("== versions ==")
    for name, version in versions().items():
        print(f"  {name:12s} {version}")
        if version == "missing":
            problems.append(f"{name} is missing: run `make install` (or `pip install -e '.[dev]'`)")
    print("== distributed backends built into torch ==")
    for name, ok in backends().items():
        print(f"  {name:12s} {'yes' if ok else 'no'}")
    if not backends()["gloo"]:
        problems.append("torch was built without gloo: install an official torch wheel")
    print("== devices ==")
    for name, value in devices().items():
        print(f"  {name:15s} {value}")
    backend = choose_backend(local_world_size=args.world_size)
    print(f"== the lessons will use: backend={backend}, "
          f"device={'cuda:LOCAL_RANK' if backend == 'nccl' else 'cpu'} ==")
    try:
        seconds = check_all_reduce(args.world_size)
        print(f"== {args.world_size}-rank all_reduce through launch.spawn: OK ({seconds * 1000:.0f} ms warm) ==")
    except Exception as exc:  # the doctor reports, it does not crash
        problems.append(f"the {args.world_size}-rank all_reduce failed: {exc}. Check that 127.0.0.1 "
                        "is reachable (no proxy or firewall on loopback) and see notebook 11.")
    if problems:
        print("== problems ==")
        for p in problems:
            print(f"  - {p}")
        return 1
    print("everything needed is here: open notebooks/00_start_here.ipynb")
    return 0


if __name__ == "__main__":
    sys.exit(main())
