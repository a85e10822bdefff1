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
import re
import sys
import time

OPTIONAL = ["torchvision", "matplotlib", "sklearn", "tqdm", "nbval", "ipykernel"]

# The oldest releases the course runs on: the ONE home of these numbers.
# pyproject.toml and environment.yml repeat them (tests/infra/test_project.py checks that),
# README.md's "Versions" says which API sets each one, and `make test-versions` runs the course on
# them. torch 2.9: the first whose gloo list-form reduce_scatter applies the op it is given (2.8's
# summed whatever was asked: PRODUCT wrong, FSDP2's averaged gradients N times too large);
# torchvision 0.24 is the release paired with torch 2.9.
FLOORS = {"python": "3.10", "torch": "2.9", "torchvision": "0.24"}

# What to run when a package is below its floor.
_UPGRADE = {"python": "install Python {floor} or newer, then recreate the venv (`make clean install`)",
            "torch": "pip install -U 'torch>={floor}'",
            "torchvision": "pip install -U 'torchvision>={floor}'"}

_RELEASE = re.compile(r"\s*v?(\d+(?:\.\d+)*)")


def release(version: str) -> tuple[int, ...] | None:
    """The release numbers ``version`` starts with: '2.14.1+cpu' -> (2, 14, 1); None if it has none ('dev')."""
    match = _RELEASE.match(version)
    return tuple(int(part) for part in match.group(1).split(".")) if match else None


def older_than(version: str, floor: str) -> bool | None:
    """Whether ``version`` is an older release than ``floor``; None when ``version`` names no release.

    Only the release numbers count: a pre-release or source build of the floor release
    ('2.8.0a0+git1234', '2.8.0.dev20250601') counts as that release, and local labels
    ('+cpu', '+cu128') are ignored. Missing parts are zeros: '2.8' == '2.8.0'.
    """
    have, need = release(version), release(floor)
    if have is None:
        return None
    if need is None:
        raise ValueError(f"floor {floor!r} is not a release number")
    width = max(len(have), len(need))
    return have + (0,) * (width - len(have)) < need + (0,) * (width - len(need))


def floor_problem(name: str, version: str, floor: str | None = None) -> str | None:
    """The doctor's sentence when ``name`` at ``version`` is below its floor, else None.

    None also when the version names no release ('dev', 'missing'): the doctor reports a
    missing package on its own, and does not block a build it cannot date.
    """
    floor = FLOORS[name] if floor is None else floor
    if not older_than(version, floor):
        return None
    shown = "Python" if name == "python" else name
    return (f"{shown} {version} is older than {floor}, the oldest release this course runs on: "
            + _UPGRADE[name].format(floor=floor))


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
    from ddp_tutorial.comm.hello import all_reduce_ranks
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
        elif name in FLOORS:
            too_old = floor_problem(name, version)
            if too_old:
                problems.append(too_old)
            elif older_than(version, FLOORS[name]) is None:  # e.g. a build that calls itself 'dev'
                print(f"  {'':12s} (not a release number: cannot check it against {name}>={FLOORS[name]})")
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
                        "is reachable (no proxy or firewall on loopback) and see notebook 12.")
    if problems:
        print("== problems ==")
        for p in problems:
            print(f"  - {p}")
        return 1
    print("everything needed is here: open notebooks/00_start_here.ipynb")
    return 0


if __name__ == "__main__":
    sys.exit(main())
