"""Each parallelism applied to ``CharGPT`` with torch's own pieces, in torchtitan's order (``21_capstone``).

A rank starts from the whole model (the same seed everywhere) and keeps its part of it:

1. ``pipeline_part``, pipeline parallel: the blocks of this rank's stage (``pp`` stages of
   ``layers / pp`` blocks), the embedding on the first stage only, the final norm and the
   output head on the last only;
2. ``apply_tp``, tensor parallel with sequence parallelism over the mesh's ``tp`` group
   (torchtitan's Llama plan): ``wq``, ``wk``, ``wv`` and ``w1`` column-parallel (each rank
   whole heads, a slice of the hidden units), ``wo`` and ``w2`` row-parallel with their sum
   *reduce-scattered* along the sequence; the norms run on a rank's slice of the sequence
   (``SequenceParallel``), so between blocks each rank holds ``seq / tp`` positions;
3. ``apply_fsdp``, data parallel as FSDP2 over the ``dp`` group: every block a unit, the
   stage's root one more; on top of TP each parameter is a 2-D ``DTensor`` (``Shard(0)`` over
   ``dp``, the TP placement over ``tp``).

The order matters as it does in torchtitan: TP first, so that FSDP shards DTensors that
already hold the TP split.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import nn

from ddp_tutorial.models import CharGPT

if TYPE_CHECKING:  # torch.distributed's pieces are imported by the functions that use them
    from torch.distributed.device_mesh import DeviceMesh

__all__ = ["stage_layers", "pipeline_part", "tp_plan", "block_tp_plan", "apply_tp", "apply_fsdp"]


def stage_layers(layers: int, stage: int, stages: int) -> list[int]:
    """The block indices stage ``stage`` of ``stages`` runs: an equal, contiguous share."""
    if layers % stages:
        raise ValueError(f"{stages} stages do not divide {layers} layers")
    per = layers // stages
    return list(range(stage * per, (stage + 1) * per))


def pipeline_part(model: CharGPT, stage: int, stages: int) -> CharGPT:
    """``model`` cut down, in place, to stage ``stage`` of ``stages``; the blocks keep their names."""
    keep = {str(i) for i in stage_layers(len(model.layers), stage, stages)}
    for name in [n for n in model.layers if n not in keep]:
        del model.layers[name]
    if stage > 0:
        model.tok_embeddings = None
    if stage < stages - 1:
        model.norm, model.output = None, None
    return model


def tp_plan(model: CharGPT) -> dict:
    """The plan of the stage's ends: the embedding (rows of the vocabulary per rank, its output cut
    along the sequence), the final norm (sequence parallel) and the head (its output gathered)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel

    plan = {}
    if model.tok_embeddings is not None:
        plan["tok_embeddings"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1))
    if model.output is not None:
        plan["norm"] = SequenceParallel()
        # The whole logits on every tp rank: the loss is computed the same way with or without TP.
        plan["output"] = ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate())
    return plan


def block_tp_plan() -> dict:
    """One block's plan: Megatron's split of attention and MLP, the norms sequence parallel."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, PrepareModuleInput, RowwiseParallel, SequenceParallel

    def gather_sequence() -> PrepareModuleInput:  # the block's sublayer needs every position
        return PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))

    return {
        "attention_norm": SequenceParallel(),
        "attention": gather_sequence(),
        "attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(), "attention.wv": ColwiseParallel(),
        "attention.wo": RowwiseParallel(output_layouts=Shard(1)),  # reduce-scatter: back to a sequence slice
        "ffn_norm": SequenceParallel(),
        "feed_forward": gather_sequence(),
        "feed_forward.w1": ColwiseParallel(),
        "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
    }


def apply_tp(model: CharGPT, tp_mesh: DeviceMesh) -> CharGPT:
    """Tensor and sequence parallelism over ``tp_mesh`` (a 1-D ``DeviceMesh``), in place."""
    from torch.distributed.tensor.parallel import parallelize_module

    parallelize_module(model, tp_mesh, tp_plan(model))
    for block in model.layers.values():
        parallelize_module(block, tp_mesh, block_tp_plan())
    return model


def apply_fsdp(model: CharGPT, dp_mesh: DeviceMesh, *, reshard_after_forward: bool = True) -> nn.Module:
    """FSDP2 over ``dp_mesh``: each block a unit, then the stage's root (embedding, norm, head), in place.

    Pipelined stages pass ``reshard_after_forward=False``: a stage runs the forward of every
    microbatch before their backwards, and gathering each block again per microbatch only costs time.
    """
    from torch.distributed.fsdp import fully_shard

    for block in model.layers.values():
        fully_shard(block, mesh=dp_mesh, reshard_after_forward=reshard_after_forward)
    # The root (embedding, final norm, head) never reshards: the backward needs its weights at once,
    # and saying so fixes one all-gather per step in every torch release (their defaults for the root differ).
    fully_shard(model, mesh=dp_mesh, reshard_after_forward=False)
    return model
