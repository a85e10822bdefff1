"""ddp_tutorial.env: backend/device choice for simulated machines, and rank info from the environment.

Covers ``ddp_tutorial.env.devices``, ``ddp_tutorial.env.ranks``.
"""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

from ddp_tutorial.env import (
    NotLaunchedError,
    RankInfo,
    choose_backend,
    choose_device,
    distributed,
    gloo_beside_gpus,
    local_rank,
    one_gpu_per_task,
    rank_device,
    rank_info,
    serves_cuda,
    whole_lines,
)
from ddp_tutorial.launch import spawn


@pytest.mark.parametrize("cuda_devices, local_world_size, nccl, expected", [
    (0, 1, True, "gloo"),    # a laptop: no GPU
    (0, 4, True, "gloo"),
    (1, 1, True, "nccl"),    # one GPU, one process
    (8, 8, True, "nccl"),    # a full DGX node
    (8, 4, True, "nccl"),    # fewer processes than GPUs is fine
    (2, 4, True, "gloo"),    # more processes than GPUs: NCCL would put two ranks on one GPU
    (4, 4, False, "gloo"),   # a torch build without NCCL (macOS, Windows)
])
def test_backend_choice(cuda_devices, local_world_size, nccl, expected):
    assert choose_backend(cuda_devices, local_world_size, nccl_available=nccl) == expected


@pytest.mark.parametrize("cuda_devices, local_world_size, bound, expected", [
    (1, 4, True, "nccl"),    # srun --gpus-per-task=1: each of 4 tasks sees one GPU, its own
    (1, 4, False, "gloo"),   # 4 torchrun workers (or spawned ranks) sharing one GPU
    (2, 4, True, "gloo"),    # bound to 2 GPUs each but 4 per node: not one GPU per task
    (0, 4, True, "gloo"),    # an srun task on a CPU node
])
def test_per_task_gpu_binding_takes_nccl_on_the_tasks_one_gpu(cuda_devices, local_world_size, bound, expected):
    assert choose_backend(cuda_devices, local_world_size, nccl_available=True, bound_per_task=bound) == expected
    if expected == "nccl":  # every task's own GPU is cuda:0 of what it sees
        for rank in range(local_world_size):
            assert choose_device(rank, "nccl", cuda_devices=1, bound_per_task=True) == torch.device("cuda", 0)


@pytest.mark.parametrize("environ, bound", [
    ({"SLURM_LOCALID": "2", "SLURM_PROCID": "6"}, True),                     # srun started this rank
    ({"SLURM_LOCALID": "0", "TORCHELASTIC_RUN_ID": "job", "LOCAL_RANK": "2"}, False),  # torchrun under srun
    ({"LOCAL_RANK": "1"}, False),                                            # no Slurm
])
def test_one_gpu_per_task_only_for_ranks_srun_started_itself(environ, bound):
    assert one_gpu_per_task(environ) is bound


def test_gloo_beside_gpus_is_said_in_one_line_and_only_then():
    note = gloo_beside_gpus("gloo", 1, 4)
    assert note is not None and "\n" not in note and "4 local ranks share 1 visible GPU(s)" in note
    assert "--gpus-per-task=1" in note
    assert "no NCCL" in gloo_beside_gpus("gloo", 4, 4, nccl_available=False)
    assert gloo_beside_gpus("gloo", 0, 4) is None   # no GPU: gloo is the right choice, nothing to say
    assert gloo_beside_gpus("nccl", 4, 4) is None


def test_backend_choice_on_this_machine_matches_what_torch_reports():
    has_gpus = torch.cuda.is_available() and torch.cuda.device_count() >= 1
    assert choose_backend() == ("nccl" if has_gpus and torch.distributed.is_nccl_available() else "gloo")


def test_backend_rejects_an_empty_node():
    with pytest.raises(ValueError, match="local_world_size must be >= 1"):
        choose_backend(2, 0)


@pytest.mark.parametrize("local_rank", [0, 1, 3])
def test_device_is_cuda_local_rank_with_nccl(local_rank):
    assert choose_device(local_rank, "nccl", cuda_devices=4) == torch.device("cuda", local_rank)


@pytest.mark.parametrize("local_rank", [0, 5])
def test_device_is_cpu_with_gloo(local_rank):
    assert choose_device(local_rank, "gloo", cuda_devices=4) == torch.device("cpu")


def test_device_error_names_the_rank_without_a_gpu():
    with pytest.raises(ValueError, match="local_rank 2 has no GPU: this node has 2 CUDA device"):
        choose_device(2, "nccl", cuda_devices=2)


@pytest.mark.parametrize("backend, cuda", [
    ("nccl", True), ("gloo", False), ("NCCL", True),
    ("cpu:gloo,cuda:nccl", True),   # a device map: CPU tensors to gloo, GPU tensors to NCCL
    ("cuda:nccl,cpu:gloo", True), ("cpu:gloo", False),
])
def test_which_backends_serve_cuda(backend, cuda):
    assert serves_cuda(backend) is cuda


def test_a_device_map_group_computes_on_the_ranks_gpu():
    assert choose_device(1, "cpu:gloo,cuda:nccl", cuda_devices=2) == torch.device("cuda", 1)
    assert choose_device(1, "cpu:gloo", cuda_devices=2) == torch.device("cpu")


@pytest.mark.parametrize("gpus, local_world_size, device", [
    (0, 1, "cpu"),      # a laptop: a world of one on gloo, the lesson's tensors on the CPU
    (1, 1, "cuda:0"),   # one GPU: a world of one is NCCL, so the tensors must be on cuda:0
    (1, 2, "cpu"),      # two ranks, one GPU: gloo for both
    (2, 2, "cuda:1"),   # the last local rank on its own GPU
])
def test_where_a_worlds_last_rank_puts_its_tensors(gpus, local_world_size, device):
    backend = choose_backend(gpus, local_world_size, nccl_available=True)
    environ = {"RANK": str(local_world_size - 1), "LOCAL_RANK": str(local_world_size - 1),
               "WORLD_SIZE": str(local_world_size)}
    assert choose_device(local_rank(environ), backend, cuda_devices=gpus) == torch.device(device)


@pytest.mark.parametrize("environ, expected", [
    ({"LOCAL_RANK": "3", "RANK": "7"}, 3),   # torchrun and spawn set it
    ({"LOCAL_RANK": "1"}, 1),                # an mp.spawn recipe sets only LOCAL_RANK
    ({"RANK": "5"}, 5),                      # like rank_info: no LOCAL_RANK means one node
    ({}, 0),                                 # alone, no group
])
def test_local_rank_from_the_environment(environ, expected):
    assert not dist.is_initialized()
    assert local_rank(environ) == expected


def test_a_malformed_local_rank_is_a_clear_error():
    with pytest.raises(NotLaunchedError, match="LOCAL_RANK='x'"):
        local_rank({"LOCAL_RANK": "x"})


def test_rank_info_from_a_torchrun_environment():
    env = {"RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4",
           "TORCHELASTIC_RESTART_COUNT": "2"}
    info = rank_info(env)
    assert info == RankInfo(rank=5, local_rank=1, world_size=8, local_world_size=4, restart_count=2)
    assert info.node_rank == 1 and not info.is_main


def test_without_torchrun_a_single_process_is_rank_0_of_1():
    assert rank_info({}) == RankInfo(0, 0, 1, 1)


def test_without_torchrun_a_module_that_needs_it_says_how_to_start():
    with pytest.raises(NotLaunchedError, match=r"torchrun --nproc-per-node=2 -m ddp_tutorial\.x"):
        rank_info({}, module="ddp_tutorial.x", allow_single=False)


@pytest.mark.parametrize("env, message", [
    ({"RANK": "0"}, "WORLD_SIZE is not"),
    ({"RANK": "2", "WORLD_SIZE": "2"}, "RANK=2 is not in range for WORLD_SIZE=2"),
    ({"RANK": "a", "WORLD_SIZE": "2"}, "malformed"),
    ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "2"}, "LOCAL_RANK=3"),
])
def test_broken_environments_get_clear_errors(env, message):
    with pytest.raises(NotLaunchedError, match=message):
        rank_info(env)


class _Recorder(io.RawIOBase):
    """A raw stream that records each write the text layer makes (each would be one syscall)."""

    def __init__(self):
        self.writes: list[bytes] = []

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        self.writes.append(bytes(data))
        return len(data)


def _unbuffered_text_stream() -> tuple[io.TextIOWrapper, _Recorder]:
    raw = _Recorder()
    # what ``python -u`` / PYTHONUNBUFFERED gives sys.stdout
    return io.TextIOWrapper(raw, encoding="utf-8", write_through=True), raw


def test_unbuffered_print_splits_a_line_into_several_writes():
    stream, raw = _unbuffered_text_stream()
    print("all_reduce over", 2, "ranks: OK", file=stream)
    assert len(raw.writes) > 1  # another rank's output can land between these


def test_whole_lines_makes_each_printed_line_one_write():
    stream, raw = _unbuffered_text_stream()
    whole_lines(stream)
    print("all_reduce over", 2, "ranks: OK", file=stream)
    print("second line", file=stream)
    assert raw.writes == [b"all_reduce over 2 ranks: OK\n", b"second line\n"]


def test_whole_lines_leaves_streams_without_reconfigure_alone():
    stream = io.StringIO()  # like a notebook's output stream: no reconfigure()
    whole_lines(stream)
    print("all_reduce over", 2, "ranks: OK", file=stream)
    stream.write("second line\n")
    assert stream.getvalue() == "all_reduce over 2 ranks: OK\nsecond line\n"


_WRITER = """
import sys
from ddp_tutorial.env import whole_lines
whole_lines()
rank = sys.argv[1]
for i in range(3000):
    print("rank", rank, "line", i, "of many words to widen the window: OK")
"""


def test_ranks_sharing_one_pipe_never_split_lines():
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    read_end, write_end = os.pipe()
    procs = [subprocess.Popen([sys.executable, "-c", _WRITER, str(rank)], stdout=write_end, env=env)
             for rank in range(2)]
    os.close(write_end)
    with os.fdopen(read_end) as pipe:
        lines = pipe.read().splitlines()
    assert [p.wait(timeout=60) for p in procs] == [0, 0]
    broken = [line for line in lines if not re.fullmatch(r"rank [01] line \d+ of many words to widen the window: OK", line)]
    assert not broken and len(lines) == 6000


def use_distributed_inside_spawn(rank: int, world_size: int) -> tuple:
    """A spawn target: ``distributed()`` inside a group that ``spawn`` set up."""
    group = dist.group.WORLD
    with distributed() as (info, device):
        total = torch.tensor([rank + 1.0], device=device)  # NCCL on a 2-GPU machine: a GPU tensor
        dist.all_reduce(total)  # the group still works inside
        inside = (info.rank, info.world_size, device.type, total.item())
    return inside, dist.is_initialized(), dist.group.WORLD is group


def devices_inside_spawn(rank: int, world_size: int) -> tuple:
    """A spawn target: the rank's device for the default group and for a gloo side group."""
    side = dist.new_group(backend="gloo")
    x = torch.tensor([1.0], device=rank_device())
    dist.all_reduce(x)
    return str(rank_device()), str(rank_device(side)), x.item(), local_rank()


@pytest.mark.timeout(90)
def test_rank_device_inside_spawn_matches_the_backend():
    results = spawn(devices_inside_spawn, 2, backend="gloo", timeout=60)
    assert results == [("cpu", "cpu", 2.0, rank) for rank in range(2)]


@pytest.mark.timeout(90)
def test_distributed_uses_and_leaves_alone_a_group_set_up_before():
    results = spawn(use_distributed_inside_spawn, 2, timeout=60)
    kind = "cuda" if choose_backend(local_world_size=2) == "nccl" else "cpu"  # spawn's own choice
    # inside: spawn's rank and world; after: the very same group, still initialised
    assert results == [((rank, 2, kind, 3.0), True, True) for rank in range(2)]


def test_distributed_leaves_the_group_even_when_the_body_raises(monkeypatch):
    # whole_lines() would reconfigure pytest's own streams: give it streams it leaves alone
    monkeypatch.setattr(sys, "stdout", io.StringIO())
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert not dist.is_initialized()
    seen = []
    try:
        with pytest.raises(ValueError, match="raised inside"):
            with distributed(environ={}) as (info, device):  # no torchrun: a world of one, in this process
                seen.append((dist.is_initialized(), dist.get_world_size(), info))
                raise ValueError("raised inside")
        assert seen == [(True, 1, RankInfo(0, 0, 1, 1))]
        assert not dist.is_initialized()
    finally:
        if dist.is_initialized():  # never leave a group behind for the other tests
            dist.destroy_process_group()


def test_distributed_makes_the_given_device_current_and_yields_it(monkeypatch):
    # A model-parallel rank passes its first own device (10); on the CPU nothing becomes current.
    monkeypatch.setattr(sys, "stdout", io.StringIO())
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    try:
        with distributed("gloo", environ={}, device=torch.device("cpu")) as (_, device):
            assert device == torch.device("cpu") and rank_device() == torch.device("cpu")
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def test_a_gpu_rank_binds_its_group_to_its_own_gpu():
    from ddp_tutorial.env import bound_device
    # 4 GPUs, nccl: local rank 3 binds cuda:3; gloo on the CPU binds nothing
    assert bound_device(choose_device(3, "nccl", cuda_devices=4)) == torch.device("cuda", 3)
    assert bound_device(choose_device(0, "gloo", cuda_devices=4)) is None
    assert bound_device(torch.device("cpu")) is None


def test_a_group_made_without_a_backend_serves_what_its_config_says():
    # torch 2.6+: init_process_group() without a backend registers its accelerator's default;
    # get_backend() then says "undefined" and only the config ("cuda:nccl") names it.
    assert choose_device(1, "cuda:nccl", cuda_devices=2) == torch.device("cuda", 1)
    assert choose_device(1, "cpu:gloo", cuda_devices=2) == torch.device("cpu")
    # and rank_device really reads the config of such a group: a world of one, no backend
    import portable_workers as pw
    [(backend, config, device)] = spawn(pw.device_of_a_group_without_backend, 1, init_process_group=False,
                                        timeout=60)
    assert backend == "undefined" and config in ("cpu:gloo", "cuda:nccl")
    assert device == str(choose_device(0, config))  # "cuda:0" on a GPU machine


def test_launcher_variable_reports_the_raw_value_or_unset():
    from ddp_tutorial.env import launcher_variable
    assert launcher_variable("LOCAL_RANK", {"LOCAL_RANK": "3"}) == "3"
    assert launcher_variable("LOCAL_RANK", {"RANK": "1"}) == "unset"   # no fallback to RANK
    assert launcher_variable("LOCAL_RANK", {"LOCAL_RANK": "x"}) == "x"  # shown as set, not parsed
