"""Each parallelism applied to ``CharGPT`` with torch's own pieces, in torchtitan's order (``22_capstone``).

A rank starts from the whole model (the same seed everywhere) and keeps its part of it:

1. ``pipeline_part``, pipeline parallel: the blocks of this rank's stage (``pp`` stages of
   ``layers / pp`` blocks), the embedding on the first stage only, the final norm and the
   output head on the last only;
2. ``apply_tp``, tensor parallel with sequence parallelism over the mesh's ``tp`` group
   (torchtitan's Llama plan): ``wq``, ``wk``, ``wv`` and ``w1`` column-parallel (each rank
   whole heads, a slice of the hidden units), ``wo`` and ``w2`` row-parallel with their sum
   *reduce-scattered* along the sequence; the norms run on a rank's slice of the sequence
   (``SequenceParallel``), so between blocks each rank holds ``seq / tp`` positions;
3. ``apply_cp``, context parallel over the mesh's ``cp`` group: each rank holds a contiguous
   slice of the sequence, and every block's attention runs lesson 20's ``ring_attention`` over
   the group, its rotary positions shifted to the slice's start (``SliceAttention``);
4. ``apply_fsdp``, data parallel as FSDP2 over the ``dp`` group, or over ``dp x cp`` flattened
   where ``cp > 1`` (named ``dp_cp`` here; torchtitan's FSDP mesh is ``dp_shard_cp``, its ``dp_cp``
   also holds ``dp_replicate`` and serves the loss; with no replicate dimension they are the same
   ranks. The cp ranks hold the same weights and their gradients are averaged too): every block a unit, the stage's root one more; on top of TP each parameter
   is a 2-D ``DTensor`` (``Shard(0)`` over ``dp``, the TP placement over ``tp``).

The order matters as it does in torchtitan: TP first, so that FSDP shards DTensors that
already hold the TP split.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch import nn

from ddp_tutorial.context_parallel.ring_attention import ring_attention
from ddp_tutorial.models import CharGPT, rotary

if TYPE_CHECKING:  # torch.distributed's pieces are imported by the functions that use them
    from torch.distributed.device_mesh import DeviceMesh

__all__ = ["stage_layers", "pipeline_part", "fsdp_mesh", "tp_plan", "block_tp_plan", "apply_tp", "SliceAttention", "apply_cp", "apply_fsdp"]


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


def fsdp_mesh(mesh: DeviceMesh) -> DeviceMesh:
    """The ranks that hold the same weights, which FSDP2 shards over: ``dp`` x ``cp``.

    ``mesh["dp"]`` or ``mesh["cp"]`` where the other has one rank; with both, the two dimensions
    flattened into one, ``"dp_cp"``, as torchtitan flattens ``dp_shard x cp`` into ``"dp_shard_cp"``
    for FSDP (``DeviceMesh._flatten``, private but in
    every release since torch 2.4). Not flattened where one is enough: torch may hand a flattened
    dimension the group of an equal one or a new group, depending on the release.
    """
    if mesh["cp"].size() == 1:
        return mesh["dp"]
    if mesh["dp"].size() == 1:
        return mesh["cp"]
    return mesh["dp", "cp"]._flatten("dp_cp")


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


class SliceAttention:
    """Causal attention of this rank's contiguous slice of the sequence with every earlier position:
    rotary positions from the slice's start, then ``ring_attention`` over ``group``.

    A ``GPTAttention.context``: called with the rank's q, k, v ``(batch, heads, seq / cp, head_dim)``
    (under tensor parallelism, its heads of them), it returns the same rows of causal attention
    over the whole sequence.
    """

    def __init__(self, group: dist.ProcessGroup):
        self.group = group

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        offset = dist.get_rank(self.group) * q.shape[-2]  # slices are equal: rank r starts at r x length
        return ring_attention(rotary(q, offset), rotary(k, offset), v, causal=True, group=self.group)


def apply_cp(model: CharGPT, cp_mesh: DeviceMesh) -> CharGPT:
    """Context parallelism over ``cp_mesh`` (1-D), in place: every block's attention a ring over its group."""
    context = SliceAttention(cp_mesh.get_group())
    for block in model.layers.values():
        block.attention.context = context
    return model


def apply_fsdp(model: CharGPT, dp_mesh: DeviceMesh, *, reshard_after_forward: bool = True) -> nn.Module:
    """FSDP2 over ``dp_mesh``: each block a unit, then the stage's root (embedding, norm, head), in place.

    ``dp_mesh`` is the 1-D mesh of the ranks that hold the same weights and average their
    gradients: ``dp``, or ``dp x cp`` flattened (``fsdp_mesh``).

    Pipelined stages pass ``reshard_after_forward=False``, torchtitan's choice
    (``reshard_after_forward = not pp_enabled``) and reason: "to avoid per-microbatch all-gathers,
    which can be expensive and non-overlapped". Under 1F1B a stage interleaves the forwards and
    backwards of its microbatches; keeping a stage's gathered weights costs memory, not gathers.
    """
    from torch.distributed.fsdp import fully_shard

    for block in model.layers.values():
        fully_shard(block, mesh=dp_mesh, reshard_after_forward=reshard_after_forward)
    # The root (embedding, final norm, head) never reshards: the backward needs its weights at once,
    # and saying so fixes one all-gather per step in every torch release (their defaults for the root differ).
    fully_shard(model, mesh=dp_mesh, reshard_after_forward=False)
    return model
