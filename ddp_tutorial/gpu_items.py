"""What ``make gpu-check`` runs (``ddp_tutorial.gpu_check`` runs it): the README's "Checked on a GPU" as data.

Each ``Item`` is a command that must exit 0 and print every line it expects, and the number of
GPUs it needs; ``ITEMS`` are the specific checks, by lesson, ``SUITES`` the whole suites (run
last: a lent machine is often lent for minutes). ``tests/infra/test_gpu_check.py`` checks that
each names a test, module or target that exists.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["TORCHRUN", "PYTEST", "Item", "tests", "torchrun", "ITEMS", "SUITES"]

# torchrun on one node, meeting at 127.0.0.1 on a free port (gpu_check fills {port} in): the
# static rendezvous, not --standalone's, whose agent unpickles what its store receives (lesson 09)
TORCHRUN = ("{python}", "-m", "torch.distributed.run", "--master-addr=127.0.0.1", "--master-port={port}")
PYTEST = ("{python}", "-m", "pytest", "-p", "no:cacheprovider", "-q")


@dataclass(frozen=True)
class Item:
    """One check: ``command`` ({python} is this interpreter) must exit 0 and print every ``expect``."""
    name: str
    min_gpus: int
    command: tuple[str, ...]
    expect: tuple[str, ...] = ()
    timeout: float = 600.0


def tests(*node_ids: str) -> tuple[str, ...]:
    return PYTEST + node_ids


def torchrun(nproc: int, module: str, *args: str) -> tuple[str, ...]:
    return TORCHRUN + (f"--nproc-per-node={nproc}", "-m", module, *args)


ITEMS = [
    Item("doctor: one rank on nccl/cuda:0", 1, ("{python}", "-m", "ddp_tutorial", "--world-size", "1"),
         ("backend=nccl, device=cuda:LOCAL_RANK", "1-rank all_reduce through launch.spawn: OK")),
    Item("doctor: two ranks on nccl", 2, ("{python}", "-m", "ddp_tutorial"),
         ("backend=nccl, device=cuda:LOCAL_RANK", "2-rank all_reduce through launch.spawn: OK")),
    Item("1 GPU: a world of one on nccl/cuda:0, sub-groups too", 1, tests(
        "tests/infra/test_launch.py::test_hello_runs_alone_as_a_world_of_one",
        "tests/comm/test_process_groups.py::test_subgroups_reduce_only_inside_their_group[1]")),
    Item("1 GPU: training, 1 process on nccl/cuda:0 and 2 on gloo", 1, tests(
        "tests/training/test_train.py::test_bench_train_tiny_run_is_well_formed")),
    Item("1 GPU: deterministic training is bitwise equal", 1, tests(
        "tests/training/test_train.py::test_seed_fixes_the_result_and_lr_zero_keeps_the_initial_weights")),
    Item("1 GPU: train twice from a shell, same weights", 1, ("{python}", "-c", (
        "import subprocess, sys, tempfile\n"
        "from ddp_tutorial.training.checkpoint import load_checkpoint, same_weights\n"
        "with tempfile.TemporaryDirectory() as d:\n"
        "    for name in 'ab':\n"
        "        subprocess.run([sys.executable, '-m', 'ddp_tutorial.training.train', '--epochs', '1',\n"
        "                        '--checkpoint', f'{d}/{name}.pt'], check=True)\n"
        "    a, b = (load_checkpoint(f'{d}/{n}.pt')['model'] for n in 'ab')\n"
        "    print('same_weights:', same_weights(a, b))\n")), ("same_weights: True",)),
    Item("1 GPU: map_location puts a checkpoint on its rank's device", 1, tests(
        "tests/pitfalls/test_pitfalls.py::test_checkpoint_pitfalls")),
    Item("2 GPUs: every 2-rank spawn on nccl (p2p, groups, collectives, DDP, training)", 2, tests(
        "tests/comm/test_p2p.py", "tests/comm/test_process_groups.py", "tests/comm/test_collectives.py",
        "tests/data_parallel/test_ddp_spawn.py", "tests/data_parallel/test_ddp_from_scratch.py",
        "tests/training/test_train.py")),
    Item("2 GPUs: the pitfalls' tests on nccl", 2, tests("tests/pitfalls/test_pitfalls.py")),
    Item("2 GPUs: the pitfalls print an 'on nccl:' line", 2, ("{python}", "-m", "ddp_tutorial.pitfalls"),
         ("  on nccl: ",)),
    Item("2 GPUs: uneven inputs end in the NCCL watchdog", 2, tests(
        "tests/data_parallel/test_ddp_spawn.py::test_uneven_inputs_without_join_hang_until_the_collective_timeout")),
    Item("4 GPUs: model parallel, each rank on its own two GPUs", 4,
         torchrun(2, "ddp_tutorial.pipeline_parallel.model_parallel"),
        ("rank 0 devices ['cuda:0', 'cuda:1']", "equals one-process training: True")),
    Item("4 GPUs: model parallel's tests", 4, tests("tests/pipeline_parallel/test_model_parallel.py")),
    Item("4 GPUs: tensor parallel on nccl", 4, torchrun(4, "ddp_tutorial.tensor_parallel.split_mlp"), ("OK: ",)),
    Item("4 GPUs: device mesh on nccl", 4, torchrun(4, "ddp_tutorial.tensor_parallel.device_mesh"), ("OK: ",)),
    Item("4 GPUs: ZeRO on nccl", 4, torchrun(4, "ddp_tutorial.sharding.zero"), ("OK: ",)),
    Item("4 GPUs: FSDP2 on nccl", 4, torchrun(4, "ddp_tutorial.sharding.fsdp"), ("OK: ",)),
    # lesson 20: the ring's batch_isend_irecv, Ulysses' all_to_all_single, SP's reduce-scatter, on nccl
    Item("2 GPUs: ring attention on nccl", 2,
         torchrun(2, "ddp_tutorial.context_parallel.ring_attention"), ("OK: ring attention over 2",)),
    Item("2 GPUs: zig-zag ring attention on nccl", 2,
         torchrun(2, "ddp_tutorial.context_parallel.zigzag"), ("OK: zig-zag",)),
    Item("2 GPUs: Ulysses on nccl", 2,
         torchrun(2, "ddp_tutorial.context_parallel.ulysses"), ("OK: Ulysses over 2",)),
    Item("2 GPUs: a Llama block, TP and TP + SP, on nccl", 2,
         torchrun(2, "ddp_tutorial.tensor_parallel.sequence_parallel"), ("+ sequence parallel over 2",)),
    Item("2 GPUs: the vocabulary split on nccl", 2,
         torchrun(2, "ddp_tutorial.tensor_parallel.vocab_parallel"), ("OK: vocabulary split",)),
    Item("2 GPUs: the Llama plan and loss_parallel on nccl", 2,
         torchrun(2, "ddp_tutorial.tensor_parallel.llama_plan"), ("OK: TinyLlama",)),
    # lessons 18, 19, 21, 22: each module's own check against one process, on nccl; a world of
    # one first, since a lent machine often has a single GPU
    Item("1 GPU: ZeRO-3 from scratch, a world of one on nccl", 1, ("{python}", "-m", "ddp_tutorial.sharding.zero3_train"),
         ("OK: ZeRO-3 from scratch equals one process, 1 rank(s)",)),
    Item("1 GPU: expert dispatch, a world of one on nccl", 1, (
        "{python}", "-m", "ddp_tutorial.expert_parallel.dispatch", "--capacity-factor", "1.0"), ("OK: 4 experts over 1",)),
    Item("2 GPUs: ZeRO-3 from scratch on nccl", 2, torchrun(2, "ddp_tutorial.sharding.zero3_train"),
         ("OK: ZeRO-3 from scratch equals one process, 2 rank(s)",)),
    Item("2 GPUs: FSDP2 in practice on nccl", 2, torchrun(2, "ddp_tutorial.sharding.fsdp_practice"),
         ("OK: FSDP2 in practice equals Zero3 and one process, 2 rank(s)",)),
    Item("4 GPUs: a sharded checkpoint saved and loaded on nccl", 4, torchrun(4, "ddp_tutorial.sharding.sharded_checkpoint"),
         ("OK: a sharded checkpoint loads back exactly, 4 rank(s)",)),
    Item("2 GPUs: 1F1B by hand on nccl", 2, torchrun(2, "ddp_tutorial.pipeline_parallel.one_f_one_b"),
         ("equals one process (loss and gradients within 1e-12): True",)),
    Item("2 GPUs: torch's pipeline schedules on nccl", 2, torchrun(2, "ddp_tutorial.pipeline_parallel.torch_schedules"),
         ("1F1B ", "equals one process (1e-12): True")),
    Item("2 GPUs: expert dispatch on nccl", 2, torchrun(2, "ddp_tutorial.expert_parallel.dispatch"), ("OK: ",)),
    Item("4 GPUs: experts and data parallel on nccl", 4, torchrun(4, "ddp_tutorial.expert_parallel.ep_dp"), ("OK: ",)),
    Item("4 GPUs: the capstone, tp2 x pp2, on nccl", 4, torchrun(4, "ddp_tutorial.capstone.composed", "--tp", "2", "--pp", "2"),
         ("OK: ",)),
    Item("4 GPUs: the capstone saved as dp2 x tp2, resumed as tp2 x pp2", 4, torchrun(
        4, "ddp_tutorial.capstone.resume", "--save-layout", "dp=2,tp=2", "--load-layout", "tp=2,pp=2"), ("OK: saved under",)),
    Item("8 GPUs: the capstone, dp2 x tp2 x pp2, on nccl", 8, torchrun(
        8, "ddp_tutorial.capstone.composed", "--dp", "2", "--tp", "2", "--pp", "2"), ("OK: ",)),
]


# The whole suites last: on a machine lent for minutes the specific items report first.
SUITES = [
    Item("unit tests (make unit)", 1, ("make", "unit"), timeout=1800),
    Item("nbval against the stored CPU outputs (make nbval)", 1, ("make", "nbval"), timeout=1800),
    Item("nbval on portable and AVX2 kernels (make nbval-portable)", 1, ("make", "nbval-portable"), timeout=3600),
]
