"""Lesson 02's exercise: join a group through a ``file://`` store."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from ddp_tutorial.env import rank_device
from ddp_tutorial.exercises.exercise import Exercise
from ddp_tutorial.exercises.harness import Report, load_function, run_cases
from ddp_tutorial.exercises.recording import checked_new_group, patched
from ddp_tutorial.exercises.tracing import traced


def init_from_file_worker(rank: int, world_size: int, source: str, function: str, trace_dir: str) -> Report:
    """Let the learner's function join the group (the launcher did not), then test the group."""
    path = os.path.join(trace_dir, "rendezvous")  # the same path for every rank, fresh for each launch

    def joined() -> str | None:
        load_function(source, function)(rank, world_size, path)
        if not dist.is_initialized():
            return (f"{function} returned, but there is no default group "
                    "(dist.is_initialized() is False): call dist.init_process_group")
        if (dist.get_rank(), dist.get_world_size()) != (rank, world_size):
            return (f"the group says rank {dist.get_rank()} of {dist.get_world_size()}, "
                    f"but this is rank {rank} of {world_size}: pass rank= and world_size= through")
        if not os.path.exists(path):
            return (f"the group was not made through the file {os.path.basename(path)!r} (nothing was "
                    "written there; was it env://?): pass init_method=Path(path).absolute().as_uri(), "
                    "a file:// URL")
        x = torch.tensor([rank + 1.0], device=rank_device())
        dist.all_reduce(x)  # the group must work: 1 + 2 + ... + world_size
        if x.item() != world_size * (world_size + 1) / 2:
            return f"an all-reduce in the new group gave {x.item():g}, not {world_size * (world_size + 1) // 2}"
        return None

    try:
        with traced(rank, trace_dir) as trace:
            return run_cases(trace, [(f"joining a world of {world_size}", joined)])
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


EXERCISES = [
    Exercise(
        name="init_from_file", number="2.1", lesson=2, notebook="02_process_groups.ipynb",
        title="join a group through a file:// store", level="warm-up",
        task=("Write the set-up a rank does before any collective: join the default process group "
              "with the file:// init method, the store being a file every rank can see."),
        hint=("dist.init_process_group(backend, init_method=Path(path).absolute().as_uri(), "
              "rank=rank, world_size=world_size); the backend from env.choose_backend(local_world_size="
              "world_size), as join_with does in ddp_tutorial/comm/process_groups.py."),
        checks=("starts the ranks without a group, calls your function on each with one fresh path, then "
                "checks that a default group exists with the right rank and world size, that it was made "
                "through that file (not env://), and that an all-reduce in it gives 1 + 2 + ... + n"),
        worker=init_from_file_worker, init_process_group=False,
        hang_hint=("init_process_group waits until world_size ranks have met in the same store: do all "
                   "ranks pass the same path, their own rank and the right world_size?")),
]


def group_sums_worker(rank: int, world_size: int, source: str, function: str, trace_dir: str) -> Report:
    """Call the learner's function with two sets of values; every new_group call is compared across ranks."""
    fn = load_function(source, function)
    def case(values: list[float]):
        def run() -> str | None:
            group = [r for r in range(world_size) if r % 2 == rank % 2]
            want_group, want_world = sum(values[r] for r in group), sum(values)  # by hand, not the solution
            got = fn(rank, world_size, values[rank])
            if not (isinstance(got, tuple) and len(got) == 2):
                return f"{function} returned {got!r}, not a tuple (group_sum, world_sum)"
            names = ("group", "world")
            for label, x, want, ranks in zip(names, got, (want_group, want_world), (group, list(range(world_size)))):
                if isinstance(x, torch.Tensor):
                    return f"the {label} sum is a tensor: return a Python float (.item())"
                if not isinstance(x, (int, float)):
                    return f"the {label} sum is a {type(x).__name__}, not a float"
                if abs(x - want) > 1e-4 * max(1.0, abs(want)):
                    return f"rank {rank}'s {label} sum is {x:g}, expected {want:g} (ranks {ranks})"
            return None
        return run

    with traced(rank, trace_dir) as trace, \
            patched([(dist, "new_group", checked_new_group(trace, world_size, dist.new_group))]):
        return run_cases(trace, [
            ("value = rank + 1", case([r + 1.0 for r in range(world_size)])),
            ("value = 10 ** rank", case([10.0 ** r for r in range(world_size)])),
        ])


EXERCISES.append(
    Exercise(
        name="group_sums", number="2.2", lesson=2, notebook="02_process_groups.ipynb",
        title="sum in the even and the odd sub-group", level="warm-up",
        task=("Make the even ranks and the odd ranks each a sub-group with dist.new_group, then all-reduce "
              "a value inside the rank's own group and over the whole world."),
        hint=("groups = [dist.new_group(ranks) for ranks in (evens, odds)] on EVERY rank (skip the odd group "
              "when it is empty); dist.all_reduce(t, group=groups[rank % 2]), then dist.all_reduce(t2) with "
              "no group for the world."),
        checks=("calls your function with value = rank + 1, then value = 10 ** rank, compares every "
                "new_group call across the ranks, and compares both sums with the ones computed by hand"),
        worker=group_sums_worker, world_sizes=(1, 2, 3, 4),
        hang_hint=("every rank must call new_group for each group, in the same order, even for a group it "
                   "is not in; and a collective in a sub-group only meets the ranks of that group")),
)
