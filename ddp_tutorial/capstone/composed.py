"""``CharGPT`` trained on a ``pp x dp x cp x tp`` mesh, equal to one process (``22_capstone``).

Each rank builds the whole model from the run's seed, keeps its pipeline stage, splits it
over its ``tp`` group, makes its attention a ring over its ``cp`` group and shards it over
its ``dp`` group, or ``dp x cp`` (``parallelize``), then trains on its replica's rows of the
global batch, and of those rows its ``cp`` slice of the positions (contiguous: rank ``c`` of
``cp`` holds positions ``c seq/cp .. (c+1) seq/cp - 1``):

- without pipelining, forward and backward of those tokens;
- with it, ``torch.distributed.pipelining``'s 1F1B schedule over the ``pp`` group (lesson 19;
  ``schedule_for``): the replica's rows cut into ``microbatches`` (at least one per stage), the loss
  computed on the last stage, gradients averaged over the microbatches (``scale_grads``, the
  default), as one mean over the rows.

Every rank's loss is the mean over its tokens, all of the same count, and FSDP2 averages the
gradients over ``dp`` and ``cp``, so every step is one Adam step on the gradient of the mean loss
over the global batch: the reference's step. After ``steps`` steps the whole weights are
gathered back (``full_tensor()`` over ``dp`` (x ``cp``) and ``tp``, then the stages over ``pp``)
and compared with ``reference.train_one_process``.

    torchrun --nproc-per-node=8 -m ddp_tutorial.capstone.composed --dp 2 --tp 2 --pp 2
    torchrun --nproc-per-node=4 -m ddp_tutorial.capstone.composed --tp 2 --pp 2
    torchrun --nproc-per-node=4 -m ddp_tutorial.capstone.composed --dp 2 --cp 2
"""

from __future__ import annotations

import logging
import warnings
from typing import TYPE_CHECKING, NamedTuple

from ddp_tutorial.capstone.layout import Layout, LayoutParser, build_mesh, check_layout, coordinates, microbatches_for

if TYPE_CHECKING or __name__ != "__main__":
    # run as python -m, it parses before torch loads (--help at once); main() then imports it as a module
    import torch
    import torch.distributed as dist

    from ddp_tutorial.capstone.chars import VOCAB, char_batch
    from ddp_tutorial.capstone.parallelize import apply_cp, apply_fsdp, apply_tp, fsdp_mesh, pipeline_part
    from ddp_tutorial.capstone.reference import GPTRun, make_gpt, next_char_loss, train_one_process
    from ddp_tutorial.doctor import older_than
    from ddp_tutorial.env import distributed, rank_device
    from ddp_tutorial.launch.errors import check_world_size, exit_on_interrupt
    from ddp_tutorial.launch.verdict import verdict
    from ddp_tutorial.pipeline_parallel.torch_schedules import SCHEDULES, same_dtype_handshake

if TYPE_CHECKING:  # imported where used: a learner's torch without these still imports the module
    from torch import nn
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining.schedules import PipelineScheduleSingle

__all__ = ["TOLERANCE", "Parts", "schedule_for", "build", "train_steps", "global_losses", "gather_weights", "composed_worker", "composed_runs", "compare", "against_one_process", "build_parser", "train_layout", "main"]

PROG = "python -m ddp_tutorial.capstone.composed"
# float64 throughout: the layouts add the same numbers in other orders (sums split over ranks,
# microbatches), so they differ from one process by rounding only, far below this.
TOLERANCE = 1e-9


def schedule_for(chunks: int, stages: int) -> str:
    """The pipeline schedule (a name of lesson 19's ``SCHEDULES``) for ``chunks`` microbatches over
    ``stages`` stages: ``"1F1B"``, which holds at most ``stages`` microbatches' activations where
    GPipe holds all ``chunks``, wherever ``chunks >= stages``; else ``"GPipe"``.

    1F1B's warm-up sends one microbatch per later stage before its first backward: fewer cannot
    fill it. ``layout.microbatches_for`` never asks for fewer, so here 1F1B always runs.
    """
    return "1F1B" if chunks >= stages else "GPipe"


def _stage(model: nn.Module, run: GPTRun, layout: Layout, *, mesh: DeviceMesh,
           device: torch.device) -> PipelineScheduleSingle:
    """The schedule (``schedule_for``) of this rank's stage, with the example tensors its neighbours send."""
    from torch.distributed import pipelining

    pp = mesh["pp"]
    chunks = microbatches_for(layout.pp, run.microbatches)
    stage, rows = pp.get_local_rank(), run.global_batch // layout.dp // chunks
    seq = run.seq // layout.cp  # a cp rank's slice of the positions
    # requires_grad: a stage sends its input's gradient back to the stage before (without it, that
    # stage's backward receives None and fails).
    hidden = torch.empty(rows, seq // layout.tp, run.dim, dtype=run.dtype, device=device).requires_grad_()
    first = torch.empty(rows, seq, dtype=torch.int64, device=device)
    logits = torch.empty(rows, seq, VOCAB, dtype=run.dtype, device=device)
    # Given, not inferred: the shapes follow from the run and the layout (a stage holds seq / (cp tp)
    # positions between blocks), so the first step needs no shape inference between stages.
    piece = pipelining.PipelineStage(model, stage, layout.pp, device, input_args=first if stage == 0 else hidden,
                                     output_args=logits if stage == layout.pp - 1 else hidden, group=pp.get_group())
    _release_workarounds(piece)
    schedule = getattr(pipelining, SCHEDULES[schedule_for(chunks, layout.pp)][0])
    # scale_grads=False: _average_microbatches divides instead (see _release_workarounds)
    return schedule(piece, chunks, loss_fn=next_char_loss, scale_grads=False)


def _release_workarounds(piece: PipelineStage) -> None:
    """What older torch releases need here and the concept does not, in one place (the version notes of
    the notebook's section 4 say the same):

    - torch 2.9's first-step shape/dtype handshake between stages aborts on gloo: it is replaced by
      ``same_dtype_handshake`` (lesson 19), done here;
    - torch 2.9's in-place ``div_`` of a ``Partial`` DTensor (a sequence-parallel norm's gradient)
      changes nothing, so the schedule's own in-place scaling is off (``scale_grads=False``) and
      ``_average_microbatches`` divides out of place (tp with pp otherwise trained off one process);
    - torch 2.9's stage checks its inputs' strides: ``train_steps`` hands it contiguous inputs;
    - some releases refuse fewer microbatches than stages (pytorch#144702): ``layout.microbatches_for``.
    """
    if older_than(torch.__version__, "2.10"):
        same_dtype_handshake(piece)


def _average_microbatches(model: nn.Module, chunks: int) -> None:
    """The stage's gradients, summed over ``chunks`` microbatches, made their mean. A ``Partial``
    gradient (a replicated norm's, computed from a sequence slice under TP) is summed over ``tp``
    first (``Replicate``), as the non-pipelined step's optimizer would; other placements stay."""
    from torch.distributed.tensor import DTensor, Replicate

    for p in model.parameters():
        if p.grad is None:
            continue
        grad = p.grad
        if isinstance(grad, DTensor) and any(pl.is_partial() for pl in grad.placements):
            grad = grad.redistribute(grad.device_mesh, [Replicate() if pl.is_partial() else pl for pl in grad.placements])
        p.grad = grad / chunks  # out of place (see _release_workarounds)


def _train_step(model: nn.Module, schedule: PipelineScheduleSingle | None, optimizer: torch.optim.Optimizer, *,
                batch: tuple[torch.Tensor, torch.Tensor], stage: int,
                stages: int, chunks: int) -> torch.Tensor:
    """One step on ``batch`` (inputs, targets); the replica's mean loss on the last stage, 0 elsewhere."""
    inputs, targets = batch
    optimizer.zero_grad()
    if schedule is None:
        loss = next_char_loss(model(inputs), targets)
        loss.backward()
    else:
        losses: list[torch.Tensor] = []
        last = stage == stages - 1
        args = (inputs,) if stage == 0 else ()
        schedule.step(*args, target=targets if last else None, losses=losses if last else None)
        _average_microbatches(model, chunks)
        loss = torch.stack(losses).mean() if last else torch.zeros((), dtype=torch.float64)
    optimizer.step()
    return loss.detach().to(torch.float64).cpu()


def gather_weights(model: nn.Module, mesh: DeviceMesh) -> dict[str, torch.Tensor]:
    """The whole model's weights, on every rank: each DTensor gathered, then the stages' sets joined."""
    from torch.distributed.tensor import DTensor

    mine = {n: (p.full_tensor() if isinstance(p, DTensor) else p).detach().cpu()
            for n, p in model.named_parameters()}
    stages: list = [None] * mesh["pp"].size()
    dist.all_gather_object(stages, mine, group=mesh["pp"].get_group())
    return {n: w for state in stages for n, w in state.items()}


def _quiet_known_notes() -> None:
    """Silence two notes that do not apply here, so that rank output shows only this lesson's lines."""
    # FSDP2 warns that the root returns a view (TP's local logits): in-place ops on it would skip a
    # hook; the loss reads the logits and never writes them.
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module")
    # full_tensor() of a dp x tp sharded weight takes two all-gathers, once, at the end: slow is fine.
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)


class Parts(NamedTuple):
    """What a rank trains with: its layout, the mesh, its piece of the model, Adam on it, the schedule,
    and the 1-D mesh FSDP2 shards over (``dp`` or ``dp_cp``; ``None`` without FSDP2)."""

    run: GPTRun
    layout: Layout
    mesh: DeviceMesh
    model: nn.Module
    optimizer: torch.optim.Optimizer
    schedule: PipelineScheduleSingle | None
    device: torch.device
    fsdp: DeviceMesh | None = None


def build(world_size: int, layout: dict, run: GPTRun) -> Parts:
    """This rank's part of the run on the mesh of ``layout``: stage, then TP, CP, FSDP2, then Adam."""
    shape = check_layout(Layout(**layout), world_size, **run.model_limits())
    _quiet_known_notes()
    device = rank_device()
    mesh = build_mesh(shape)
    model = pipeline_part(make_gpt(run).to(device), mesh["pp"].get_local_rank(), shape.pp)
    if shape.tp > 1:
        apply_tp(model, mesh["tp"])
    if shape.cp > 1:
        apply_cp(model, mesh["cp"])
    sharded = fsdp_mesh(mesh) if shape.dp * shape.cp > 1 else None
    if sharded is not None:
        apply_fsdp(model, sharded, reshard_after_forward=shape.pp == 1)
    optimizer = torch.optim.Adam(model.parameters(), lr=run.lr)
    schedule = _stage(model, run, shape, mesh=mesh, device=device) if shape.pp > 1 else None
    return Parts(run, shape, mesh, model, optimizer, schedule, device, sharded)


def train_steps(parts: Parts, steps: range) -> list[torch.Tensor]:
    """The steps numbered ``steps`` (each its own global batch); this rank's loss of each."""
    run, mesh = parts.run, parts.mesh
    dp_rank, stage = mesh["dp"].get_local_rank(), mesh["pp"].get_local_rank()
    length = run.seq // parts.layout.cp
    cols = slice(mesh["cp"].get_local_rank() * length, (mesh["cp"].get_local_rank() + 1) * length)
    losses = []
    for step in steps:
        inputs, targets = char_batch(step, run.global_batch, run.seq, part=dp_rank, parts=parts.layout.dp,
                                     seed=run.seed)
        inputs, targets = inputs[:, cols], targets[:, cols]  # this cp rank's positions
        losses.append(_train_step(parts.model, parts.schedule, parts.optimizer,  # contiguous: _release_workarounds
                                  batch=(inputs.to(parts.device).contiguous(), targets.to(parts.device)),
                                  stage=stage, stages=parts.layout.pp,
                                  chunks=microbatches_for(parts.layout.pp, run.microbatches)))
    return losses


def global_losses(parts: Parts, losses: list[torch.Tensor]) -> list[float]:
    """Each step's loss over the global batch, on every rank: the last stage's, averaged over replicas
    and sequence slices (every rank's mean is over as many tokens)."""
    total = torch.stack(losses).to(parts.device)
    dist.all_reduce(total, group=parts.mesh["pp"].get_group())  # the other stages add 0
    dist.all_reduce(total, group=parts.mesh["dp"].get_group())
    dist.all_reduce(total, group=parts.mesh["cp"].get_group())
    return (total / (parts.layout.dp * parts.layout.cp)).cpu().tolist()


def composed_worker(rank: int, world_size: int, layout: dict, steps: int = 3, run: dict | None = None) -> dict:
    """Train ``steps`` steps on the mesh of ``layout`` (``{"dp": 2, "tp": 2, ...}``); rank 0 returns the
    global loss of each step and the whole weights, every rank its coordinates and groups' ranks."""
    parts = build(world_size, layout, GPTRun(**(run or {})))
    mesh = parts.mesh
    losses = global_losses(parts, train_steps(parts, range(steps)))
    weights = gather_weights(parts.model, mesh)
    dist.barrier()  # no rank tears the group down under a peer's last collective (see sharding.fsdp)
    return {"rank": rank, "coordinates": coordinates(rank, parts.layout),
            "mesh_coordinates": dict(zip(mesh.mesh_dim_names, mesh.get_coordinate())),
            "groups": {d: dist.get_process_group_ranks(mesh[d].get_group()) for d in mesh.mesh_dim_names},
            "schedule": type(parts.schedule).__name__ if parts.schedule is not None else None,
            "losses": losses if rank == 0 else None,
            "state": weights if rank == 0 else None}


def composed_runs(rank: int, world_size: int, layouts: list[dict], steps: int = 3) -> list[dict]:
    """``composed_worker`` for each layout in turn, on the same ranks: one launch for several layouts."""
    return [composed_worker(rank, world_size, layout, steps) for layout in layouts]


def compare(result: dict, reference: dict) -> dict[str, float]:
    """The largest difference of the losses and of the weights between a layout's rank 0 and the reference."""
    loss = max(abs(a - b) for a, b in zip(result["losses"], reference["losses"]))
    weights = max((result["state"][n] - w).abs().max().item() for n, w in reference["state"].items())
    missing = set(reference["state"]) ^ set(result["state"])
    if missing:
        raise AssertionError(f"the gathered weights differ in names: {sorted(missing)}")
    return {"loss": loss, "weights": weights}


def against_one_process(result: dict, steps: int, claim: str) -> None:
    """The capstone's command lines' last word (rank 0): ``result`` against one process trained ``steps``
    steps, ended by ``launch.verdict`` (``OK: claim`` or ``FAILED: claim``, exit 1 on failure)."""
    verdict(max(compare(result, train_one_process(GPTRun(), steps)).values()) < TOLERANCE, claim)


def build_parser() -> LayoutParser:
    """The command line, torch-free: ``--help`` and a bad option answer before torch loads."""
    parser = LayoutParser(prog=PROG, description=__doc__.splitlines()[0])
    parser.add_layout_options(dp_fills=True)
    parser.add_argument("--steps", type=int, default=3, help="training steps compared with one process (default 3)")
    return parser


def train_layout(given: dict[str, int | None], steps: int) -> None:
    """The layout checked against the world size and the model before any group (once per node, exit 2), then
    trained and compared with one process; ``dp``, when not given, fills what the others leave."""
    def layout_for(world_size: int) -> Layout:
        dp = given["dp"] or max(1, world_size // (given["tp"] * given["pp"] * given["cp"]))
        return check_layout(Layout(**dict(given, dp=dp)), world_size, **GPTRun().model_limits())

    layout = check_world_size(PROG, layout_for, advice="python -m ddp_tutorial.capstone.layout --list shows every "
                              "layout; the sizes must multiply to torchrun's --nproc-per-node")
    with exit_on_interrupt(PROG, "nothing was saved; run it again"), distributed() as (info, _):
        result = composed_worker(info.rank, info.world_size, vars(layout), steps)
    if info.is_main:
        print("losses:", " ".join(f"{x:.4f}" for x in result["losses"]))
        against_one_process(result, steps, f"{layout} on {info.world_size} ranks trains CharGPT as one process "
                                           f"does ({steps} steps: losses and weights within {TOLERANCE:g})")


def main(argv: list[str] | None = None) -> None:
    """``python -m ddp_tutorial.capstone.composed``: parse and check the sizes (no torch yet), then ``train_layout``."""
    args = build_parser().parse_counts(argv)
    from ddp_tutorial.capstone import composed  # this file as a module, with torch (as __main__ it has none)

    composed.train_layout({d: getattr(args, d) for d in ("dp", "tp", "pp", "cp")}, args.steps)


if __name__ == "__main__":
    main()
