"""The Llama tensor-parallel plan with ``parallelize_module``, sequence parallel, and ``loss_parallel`` (``20_long_sequences``).

``sequence_parallel`` and ``vocab_parallel`` split a block and the vocabulary by hand. torch
says the same in a *plan*: a dict from submodule names to styles (torchtitan's Llama plan):

- ``ColwiseParallel()`` for ``wq``/``wk``/``wv`` and ``w1``/``w3``: weights ``Shard(0)``, so
  each rank's ``view(b, s, -1, head_dim)`` finds its own heads; with grouped-query attention
  ``wk``/``wv`` hold ``kv_heads`` heads, and ``tp`` must divide them (``models.tp_heads``, checked
  before the plan is applied: ``Shard(0)`` would otherwise cut a K/V head in two, silently);
- ``RowwiseParallel(output_layouts=Shard(1))`` for ``wo`` and ``w2``: the partial sums are
  reduce-scattered onto sequence shards (SP's ``g``);
- ``SequenceParallel()`` for the norms: they run on ``Shard(1)`` (seq/t positions);
- ``PrepareModuleInput`` before ``attention`` and ``feed_forward``: all-gather the sequence
  (``Shard(1)`` -> ``Replicate()``, SP's ``f``);
- the embedding ``RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1))``: the
  vocabulary-parallel embedding, reduce-scattered onto sequence shards;
- the output head ``ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)``: logits
  left sharded on the vocabulary, a DTensor, for ``loss_parallel()``, inside which
  ``F.cross_entropy`` takes the vocabulary-parallel path and never gathers the logits.

    torchrun --nproc-per-node=2 -m ddp_tutorial.tensor_parallel.llama_plan   # equal to one process
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from torch import nn

from ddp_tutorial.env import distributed
from ddp_tutorial.launch.verdict import verdict
from ddp_tutorial.models import TinyLlama, tp_heads
from ddp_tutorial.tensor_parallel.device_mesh import mesh_device_type

__all__ = ["llama_tp_plan", "make_llama", "llama_batch", "llama_one_process", "llama_plan_worker", "main"]


def llama_tp_plan(layers: int) -> dict:
    """``TinyLlama``'s tensor- and sequence-parallel plan, as torchtitan writes Llama's."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
    )

    plan = {"tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
            "norm": SequenceParallel(),
            "output": ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False)}
    for i in range(layers):
        plan |= {f"layers.{i}.{name}": style for name, style in {
            "attention_norm": SequenceParallel(),
            "attention": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            "attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(), "attention.wv": ColwiseParallel(),
            "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
            "ffn_norm": SequenceParallel(),
            "feed_forward": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            "feed_forward.w1": ColwiseParallel(), "feed_forward.w3": ColwiseParallel(),
            "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
        }.items()}
    return plan


def make_llama(seed: int = 0, layers: int = 1) -> TinyLlama:
    """The whole model every rank (and the one process) builds from ``seed``."""
    torch.manual_seed(seed)
    return TinyLlama(layers=layers)


def llama_batch(seed: int = 1, *, batch: int = 2, seq: int = 8, vocab: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens and next-token targets, the same on every rank."""
    tokens = torch.randint(0, vocab, (batch, seq + 1), generator=torch.Generator().manual_seed(seed))
    return tokens[:, :-1], tokens[:, 1:]


def llama_one_process(seed: int = 0) -> dict:
    """The loss and every gradient of the unsplit model in one process."""
    model = make_llama(seed)
    tokens, targets = llama_batch()
    loss = nn.functional.cross_entropy(model(tokens).flatten(0, 1), targets.flatten())
    loss.backward()
    return {"loss": loss.item(), "grads": {n: p.grad for n, p in model.named_parameters()}}


def llama_plan_worker(rank: int, world_size: int, seed: int = 0) -> dict:
    """``TinyLlama`` through ``llama_tp_plan`` on a 1-D mesh of all ranks; the loss by ``loss_parallel``.

    Returns the loss, every gradient gathered whole (``full_tensor``), each parameter's placements,
    the shape of this rank's logits and the collectives the loss's forward ran.
    """
    from torch.distributed.tensor import DTensor, init_device_mesh
    from torch.distributed.tensor.debug import CommDebugMode
    from torch.distributed.tensor.parallel import loss_parallel, parallelize_module

    mesh = init_device_mesh(mesh_device_type(), (world_size,))
    model = make_llama(seed)
    attention = model.layers[0].attention
    tp_heads(attention.wq.out_features // attention.head_dim, attention.wk.out_features // attention.head_dim,
             world_size)  # tp | n_kv_heads, or a clear error
    model = parallelize_module(model.to(mesh.device_type), mesh, llama_tp_plan(layers=1))
    tokens, targets = (t.to(mesh.device_type) for t in llama_batch())
    logits = model(tokens)
    with loss_parallel():  # cross_entropy on vocabulary shards; backward must run inside it too
        with CommDebugMode() as loss_comms:
            loss = nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
        loss.backward()
    grads = {n: (p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad).cpu()
             for n, p in model.named_parameters()}
    placements = {n: [str(x) for x in p.placements] for n, p in model.named_parameters()}
    result = {"loss": loss.full_tensor().item() if isinstance(loss, DTensor) else loss.item(), "grads": grads,
              "placements": placements, "local_logits": tuple(logits.to_local().shape),
              "loss_collectives": {str(op).split(".")[-1]: k for op, k in loss_comms.get_comm_counts().items()}}
    dist.barrier()  # DTensor's functional collectives may still be finishing on a peer
    return result


def compare_llama(results: list[dict], reference: dict) -> float:
    """The largest difference of any rank's loss and gathered gradients to one process's."""
    diff = 0.0
    for r in results:
        diff = max(diff, abs(r["loss"] - reference["loss"]))
        for name, grad in reference["grads"].items():
            diff = max(diff, (r["grads"][name] - grad).abs().max().item())
    return diff


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.parse_args()
    with distributed() as (info, _):
        result = llama_plan_worker(info.rank, info.world_size)
        results = [None] * info.world_size
        dist.all_gather_object(results, result)
    if info.is_main:
        diff = compare_llama(results, llama_one_process())
        ok = diff < 1e-5
        verdict(ok, f"TinyLlama through the TP + SP plan over {info.world_size} rank(s), loss by "
                    f"loss_parallel, equals one process (largest difference {diff:.1e}); logits per rank "
                    f"{result['local_logits']}, the loss's collectives {result['loss_collectives']}")


if __name__ == "__main__":
    main()
