"""How to run each lesson from a shell: the commands every lesson page of the website shows.

Pure data and string formatting (no Sphinx): the site extension (``course_site.py``) renders it,
and ``tests/infra/test_site_config.py`` checks that every ``notebooks/NN_*.ipynb`` has an entry and
that every module named here really runs (``main()`` or a ``__main__`` submodule).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

# One node meeting on loopback (torch's static rendezvous), not --standalone, whose agent unpickles
# what its store receives; either store still listens on every interface (lesson 09). Port 29500 is
# torchrun's own default; taken, torchrun stops with "address already in use": pick another.
TORCHRUN = "torchrun --master-addr=127.0.0.1 --master-port=29500"
LESSON_NAME = re.compile(r"^\d\d_\w+$")  # 00_start_here: what `notebooks/NN_*.ipynb` must be called


@dataclass(frozen=True)
class Command:
    """``python -m MODULE ARGS`` or, with ``nproc``, ``torchrun ... --nproc-per-node=NPROC -m MODULE ARGS``."""

    module: str  # relative to ddp_tutorial ("" is the package itself)
    args: str = ""
    nproc: int | None = 2  # None: one plain python process
    comment: str = ""

    @property
    def dotted(self) -> str:
        return f"ddp_tutorial.{self.module}" if self.module else "ddp_tutorial"

    def line(self) -> str:
        launcher = ("python" if self.nproc is None else f"{TORCHRUN} --nproc-per-node={self.nproc}")
        return f"{launcher} -m {self.dotted}" + (f" {self.args}" if self.args else "")

    def lines(self) -> list[str]:
        """The command, after its comment on a line of its own (a page is ~80 columns wide)."""
        return ([f"# {self.comment}"] if self.comment else []) + [self.line()]


def python(module: str, args: str = "", comment: str = "") -> Command:
    return Command(module, args, None, comment)


# Lesson (notebook stem) -> what it runs from a shell: its own module first.
COMMANDS: dict[str, tuple[Command, ...]] = {
    "00_start_here": (Command("comm.hello", comment="the first all-reduce"),
                      python("", comment="the doctor: can this machine run the course?")),
    "01_data_parallel": (python("bench", "dp", comment="DataParallel vs DDP throughput, same model"),),
    "02_process_groups": (Command("comm.process_groups"),),
    "03_start_methods": (python("comm.start_methods", comment="fork, spawn, forkserver; Process and mp.spawn"),),
    "04_point_to_point": (Command("comm.p2p"),),
    "05_collectives": (Command("comm.collectives"),),
    "06_ring_all_reduce": (Command("comm.ring"),
                           python("bench", "allreduce", comment="ring vs gloo bus bandwidth")),
    "07_ddp_spawn": (Command("data_parallel.ddp_spawn"), python("data_parallel.ddp_spawn", comment="the same, started by mp.spawn")),
    "08_ddp_from_scratch": (Command("data_parallel.ddp_from_scratch"),
                            python("bench", "ddp", comment="BucketedDDP vs torch DDP step time")),
    "09_torchrun": (Command("cluster.multinode", comment="what torchrun tells each process"),
                    Command("training.train", "--epochs 2")),
    "10_model_parallel_ddp": (Command("pipeline_parallel.model_parallel"),
                              Command("pipeline_parallel.pipeline_grid", nproc=4, comment="2 stages x 2 replicas")),
    "11_train_end_to_end": (Command("training.train", "--epochs 5"), python("training.train", "--epochs 5", comment="one process")),
    "12_debugging_and_pitfalls": (python("pitfalls", comment="every pitfall: symptom, then fix"),
                                  Command("pitfalls.launchers")),
    "13_performance": (python("bench", "collectives", comment="time and bandwidth of every collective"),
                       python("bench", "all", comment="the whole suite, about 2 minutes")),
    "14_sharding": (Command("sharding.zero"), Command("sharding.fsdp")),
    "15_tensor_parallel": (Command("tensor_parallel.split_mlp", nproc=4), Command("tensor_parallel.device_mesh", nproc=4)),
    "16_cluster": (python("cluster.jobs", "list", comment="the Slurm job scripts and what each does"),
                   python("cluster.jobs", "show multi_node.sbatch", comment="print one: copy it, then sbatch it"),
                   Command("cluster.elastic", "--epochs 2", comment="training under @record; --raise-on-rank 1 fails on purpose")),
    "17_memory": (python("sharding.calculator", "--model llama-8b --dp 8 --zero 1 --recompute full",
                         comment="bytes per rank for Llama 3 8B"),
                  python("bench", "memory", comment="the calculator against measured bytes, and recompute's cost")),
    "21_expert_parallel": (Command("expert_parallel.dispatch", nproc=4, comment="4 experts over 4 ranks = one process"),
                           Command("expert_parallel.ep_dp", nproc=4, comment="experts over 2 ranks x 2 copies, the rest data-parallel"),
                           python("expert_parallel.routing", comment="capacity and the balancing loss, in one process"),
                           python("bench", "experts", comment="dispatch + combine against the experts' compute")),
    "20_long_sequences": (Command("context_parallel.ring_attention", nproc=4, comment="ring attention = SDPA, causal and not"),
                          Command("context_parallel.zigzag", nproc=4, comment="the causal work per rank, both layouts"),
                          Command("context_parallel.ulysses"),
                          Command("tensor_parallel.sequence_parallel", comment="a Llama block: TP, then TP + SP"),
                          Command("tensor_parallel.llama_plan", comment="parallelize_module's plan and loss_parallel"),
                          python("bench", "context", comment="ring vs full attention: time and bytes per rank")),
    "22_capstone": (python("capstone.reference", comment="the one-process run every layout must equal: loss curve"),
                    python("capstone.layout", "--dp 2 --tp 2 --pp 2", comment="each rank's coordinates and groups"),
                    Command("capstone.composed", "--dp 2 --tp 2 --pp 2", nproc=8,
                            comment="dp x tp x pp on 8 ranks, checked against one process"),
                    Command("capstone.composed", "--dp 2 --cp 2", nproc=4,
                            comment="dp x cp: ring attention over cp, checked against one process"),
                    Command("capstone.traffic", "--dp 2 --tp 2 --pp 2", nproc=8,
                            comment="each group's collectives and bytes sent per step, each rank's bytes"),
                    Command("capstone.resume", "--save-layout dp=2,tp=2 --load-layout tp=2,pp=2", nproc=4,
                            comment="DCP: saved under one layout, resumed under another"),
                    python("capstone.rank_memory", "--dp 2 --tp 2",
                           comment="each rank's bytes measured beside the memory calculator's"),
                    python("capstone.rank_memory", "--plan llama3-8b --gpus 64",
                           comment="choosing a layout: what fits Llama 3 8B on 8 nodes of 8 GPUs")),
    "18_zero3_and_checkpoints": (Command("sharding.zero3_train", comment="ZeRO-3 from scratch against one process"),
                                 Command("sharding.fsdp_practice", comment="meta init, bf16 policy, accumulation"),
                                 Command("sharding.fsdp_prefetch", nproc=4,
                                         comment="prefetch and reshard settings, all-gathers counted"),
                                 Command("sharding.sharded_checkpoint", nproc=4, comment="DCP save and load"),
                                 Command("sharding.sharded_resume", "--checkpoint-dir ckpt17 --steps 6 --async-save",
                                         comment="a DCP checkpoint each step; add --fail-at-step 3 and --max-restarts=1")),
    "19_pipeline_schedules": (Command("pipeline_parallel.one_f_one_b", nproc=4, comment="1F1B from scratch, 4 stages"),
                              Command("pipeline_parallel.torch_schedules", comment="torch's seven schedules, each vs one process"),
                              python("bench", "pipeline --schedules", comment="bubble and peak of each schedule, p 2 and 4")),
    "23_how_fast": (python("bench", "roofline", comment="this machine's roofline, the course's operations on it"),
                    python("bench", "stepmodel", comment="predicted vs measured: DDP, FSDP2, TP, a pipeline; the capstone on 4"),
                    python("bench", "published", comment="the step-time model against Llama 3 and Megatron-LM"),
                    python("performance.timing_plan", "--plan llama3-405b --gpus 16384",
                           comment="the planner ranks the layouts that fit by predicted step time")),
}


def lesson_names(notebooks: Path) -> list[str]:
    """The lessons, in order: every ``NN_*.ipynb`` in ``notebooks``."""
    return sorted(p.stem for p in notebooks.glob("[0-9][0-9]_*.ipynb") if LESSON_NAME.match(p.stem))


def run_instructions(lesson: str) -> tuple[str, str]:
    """(Jupyter commands, shell commands) for a lesson; the shell part is "" without an entry."""
    jupyter = "\n".join([f"make lab    # Jupyter Lab on notebooks/: open {lesson}.ipynb", "# or",
                          f".venv/bin/jupyter lab notebooks/{lesson}.ipynb"])
    shell = "\n".join(["source .venv/bin/activate"] + [line for c in COMMANDS.get(lesson, ()) for line in c.lines()])
    return jupyter, shell if lesson in COMMANDS else ""
