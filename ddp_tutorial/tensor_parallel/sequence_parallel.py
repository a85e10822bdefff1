"""A Llama block split by hand: attention heads over ranks, then sequence parallelism (``20_long_sequences``).

Lesson 15 split an MLP. A transformer block has two such pairs: the attention, whose
``wq``/``wk``/``wv`` are column-parallel **by heads** (rank ``r`` holds query heads ``r h/t ..
(r+1) h/t`` and the K/V heads they share: ``t`` must divide ``kv_heads``, ``models.tp_heads``) and ``wo``
row-parallel; and the MLP, ``w1``/``w3`` column-, ``w2`` row-parallel. Megatron's ``f``
and ``g`` (``split_mlp``) wrap each pair: one all-reduce per pair each way.

What tensor parallelism leaves whole on every rank are the RMSNorms, the dropouts and the
residual adds: ``t`` copies of the same ``(batch, seq, dim)`` activations. **Sequence
parallelism** (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
Transformer Models", arXiv:2205.05198, section 4.2.2) splits those along the sequence: each
rank keeps ``seq/t`` positions there, and ``g``'s all-reduce becomes a reduce-scatter (sum
the partial outputs, keep my positions), ``f``'s identity an all-gather (every rank needs
the whole sequence for the column-parallel layer). An all-reduce *is* a reduce-scatter then
an all-gather, so the bytes moved do not change; the activations in the norm and dropout
regions drop to ``1/t``. The norms' weights see only their rank's positions, so their
gradients are summed over the group after backward (``sync_norm_grads``).

    torchrun --nproc-per-node=2 -m ddp_tutorial.tensor_parallel.sequence_parallel   # TP, TP + SP, one process
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from torch import nn

from ddp_tutorial.env import distributed, rank_device
from ddp_tutorial.launch.verdict import verdict
from ddp_tutorial.models import LlamaBlock, tp_heads
from ddp_tutorial.tensor_parallel.split_mlp import f, g, shard_range

__all__ = ["GatherSequence", "ScatterSequence", "gather_sequence", "scatter_sequence", "TensorParallelBlock",
           "sync_norm_grads", "make_block", "activation_bytes", "region_seed", "dropout_masks",
           "one_process_dropout", "block_input", "one_process_block", "block_worker", "main"]

SEQ_DIM = 1  # activations are (batch, seq, dim)


def all_gather_seq(x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, x.contiguous(), group=group)
    return torch.cat(parts, dim=SEQ_DIM)


def reduce_scatter_seq(x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    parts = [p.contiguous() for p in x.chunk(dist.get_world_size(group), dim=SEQ_DIM)]
    mine = torch.empty_like(parts[0])
    dist.reduce_scatter(mine, parts, group=group)  # the list form: gloo has it from torch 2.8 (README)
    return mine


class GatherSequence(torch.autograd.Function):
    """SP's ``f``: all-gather the sequence in forward; reduce-scatter the gradient in backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
        ctx.group = group
        return all_gather_seq(x, group)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return reduce_scatter_seq(grad, ctx.group), None  # each rank's gradient of every position is partial


class ScatterSequence(torch.autograd.Function):
    """SP's ``g``: reduce-scatter the partial outputs in forward; all-gather the gradient in backward."""

    @staticmethod
    def forward(ctx, partial: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
        ctx.group = group
        return reduce_scatter_seq(partial, group)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return all_gather_seq(grad, ctx.group), None  # every partial sum gets the gradient of its whole


def gather_sequence(x: torch.Tensor, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Enter the tensor-parallel region from a sequence shard (differentiable)."""
    return GatherSequence.apply(x, group)


def scatter_sequence(x: torch.Tensor, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Leave the tensor-parallel region onto a sequence shard (differentiable)."""
    return ScatterSequence.apply(x, group)


class TensorParallelBlock(nn.Module):
    """``LlamaBlock`` with its heads and MLP units split over ``group``; with ``sequence_parallel``
    its norms, dropouts and residuals on ``seq/t`` positions. Built from the whole block: same weights."""

    def __init__(self, full: LlamaBlock, group: dist.ProcessGroup | None = None, *,
                 sequence_parallel: bool = False):
        super().__init__()
        self.group, self.sequence_parallel = group, sequence_parallel
        rank, t = dist.get_rank(group), dist.get_world_size(group)
        head_dim = full.attention.head_dim
        tp_heads(full.attention.wq.out_features // head_dim, full.attention.wk.out_features // head_dim, t)
        self.attention_norm, self.ffn_norm = full.attention_norm, full.ffn_norm
        self.attention_dropout, self.ffn_dropout = full.attention_dropout, full.ffn_dropout
        self.attention, self.feed_forward = full.attention, full.feed_forward
        rows = shard_range(full.attention.wq.out_features, rank, t)  # my heads' rows: heads are contiguous
        kv_rows = shard_range(full.attention.wk.out_features, rank, t)  # my K/V heads: the ones my q heads use
        units = shard_range(full.feed_forward.w1.out_features, rank, t)
        with torch.no_grad():
            for lin, cut in ((self.attention.wq, rows), (self.attention.wk, kv_rows), (self.attention.wv, kv_rows),
                             (self.feed_forward.w1, units), (self.feed_forward.w3, units)):
                lin.weight = nn.Parameter(lin.weight[cut].clone())  # column-parallel: my output units
            for lin, cut in ((self.attention.wo, rows), (self.feed_forward.w2, units)):
                lin.weight = nn.Parameter(lin.weight[:, cut].clone())  # row-parallel: my input units

    def enter(self, x: torch.Tensor) -> torch.Tensor:
        return gather_sequence(x, self.group) if self.sequence_parallel else f(x, self.group)

    def leave(self, partial: torch.Tensor) -> torch.Tensor:
        return scatter_sequence(partial, self.group) if self.sequence_parallel else g(partial, self.group)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x``: the whole ``(batch, seq, dim)``, or with sequence parallelism this rank's ``seq/t`` positions."""
        x = x + self.attention_dropout(self.leave(self.attention(self.enter(self.attention_norm(x)))))
        return x + self.ffn_dropout(self.leave(self.feed_forward(self.enter(self.ffn_norm(x)))))


def sync_norm_grads(block: TensorParallelBlock) -> None:
    """Sum the norms' weight gradients over the group: under sequence parallelism each rank saw only
    its positions. (Without it they are whole already: ``f`` summed what flows into the norms.)"""
    if block.sequence_parallel:
        for norm in (block.attention_norm, block.ffn_norm):
            dist.all_reduce(norm.weight.grad, group=block.group)


DIM, HEADS, KV_HEADS = 32, 8, 4  # grouped-query attention: 2 query heads per K/V head; tp in 1, 2, 4


def make_block(seed: int = 0, *, dim: int = DIM, heads: int = HEADS, kv_heads: int = KV_HEADS,
               dropout: float = 0.0) -> LlamaBlock:
    """The whole block every rank (and the one process) builds from ``seed``."""
    torch.manual_seed(seed)
    block = LlamaBlock(dim, heads, kv_heads=kv_heads, dropout=dropout)
    with torch.no_grad():  # RMSNorm starts at ones: make its gradient's slices tell the ranks apart
        for norm in (block.attention_norm, block.ffn_norm):
            norm.weight.uniform_(0.5, 1.5)
    return block


def block_input(batch: int = 2, seq: int = 8, dim: int = DIM, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """The block's input and the weight ``w`` of the loss ``(out * w).sum()``."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(batch, seq, dim, generator=gen), torch.randn(batch, seq, dim, generator=gen)


def one_process_block(seed: int = 0) -> dict:
    """The unsplit block in one process: output, input gradient and every parameter gradient."""
    block = make_block(seed)
    x, w = block_input()
    x.requires_grad_()
    out = block(x)
    (out * w).sum().backward()
    return {"out": out.detach(), "input_grad": x.grad, "grads": {n: p.grad for n, p in block.named_parameters()}}


def block_worker(rank: int, world_size: int, sequence_parallel: bool = False, seed: int = 0) -> dict:
    """The block split over all ranks, forward and backward; this rank's piece of everything.

    With sequence parallelism the input, output and input gradient are this rank's positions.
    """
    from torch.distributed.tensor.debug import CommDebugMode

    device = rank_device()
    block = TensorParallelBlock(make_block(seed).to(device), sequence_parallel=sequence_parallel)
    x, w = (t.to(device) for t in block_input())
    if sequence_parallel:
        mine = shard_range(x.shape[SEQ_DIM], rank, world_size)
        x, w = x[:, mine], w[:, mine]
    x.requires_grad_()
    with CommDebugMode() as comms:
        out = block(x)
        (out * w).sum().backward()
        sync_norm_grads(block)
    counts = {str(op).split(".")[-1]: k for op, k in comms.get_comm_counts().items()}
    return {"rank": rank, "out": out.detach().cpu(), "input_grad": x.grad.cpu(), "collectives": counts,
            "grads": {n: p.grad.cpu() for n, p in block.named_parameters()}}


def activation_bytes(rank: int, world_size: int, sequence_parallel: bool = False, seq: int = 16) -> dict[str, int]:
    """The bytes this rank keeps for backward in one forward of the block (dropout 0.1), by region.

    Counted with ``saved_tensors_hooks`` (each storage once): ``"norm/dropout"`` while a norm or a
    dropout runs, ``"tensor parallel"`` elsewhere (the split linears and the attention).
    """
    block = TensorParallelBlock(make_block(dropout=0.1).to(rank_device()), sequence_parallel=sequence_parallel)
    x, _ = block_input(seq=seq)
    if sequence_parallel:
        x = x[:, shard_range(seq, rank, world_size)].clone()  # a rank holds only its positions
    region, total = ["tensor parallel"], {"norm/dropout": 0, "tensor parallel": 0}
    seen = {p.untyped_storage().data_ptr() for p in block.parameters()}  # weights are no activations

    def enter(*_: object) -> None:
        region.append("norm/dropout")

    def leave(*_: object) -> None:
        region.pop()

    for module in (block.attention_norm, block.ffn_norm, block.attention_dropout, block.ffn_dropout):
        module.register_forward_pre_hook(enter)
        module.register_forward_hook(leave)

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.untyped_storage().data_ptr() not in seen and t.numel() > 1:  # a scalar is no activation
            seen.add(t.untyped_storage().data_ptr())
            total[region[-1]] += t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        block(x.to(rank_device()).requires_grad_())
    return total


def region_seed(seed: int, rank: int, *, split: bool) -> int:
    """The dropout seed of a tensor-parallel rank (Megatron's rule, ``tensor_parallel/random.py``).

    A region every rank holds whole (TP's norms and dropouts) must draw the *same* mask on every
    rank, or the replicas drift apart: the same seed. A region split over the ranks (SP's
    positions, TP's heads) must draw *its own*: the same seed would give every rank's positions
    the same mask pattern, correlated along the sequence. Megatron offsets it by ``2718 + rank``.
    """
    return seed + 2718 + rank if split else seed


def dropout_masks(rank: int, world_size: int, sequence_parallel: bool = False, per_rank_seed: bool = False,
                  seed: int = 5) -> dict:
    """One forward of the block with dropout 0.5, seeded by ``region_seed``: the attention dropout's
    keep mask on this rank's positions, and the block's output."""
    block = TensorParallelBlock(make_block(dropout=0.5).to(rank_device()), sequence_parallel=sequence_parallel)
    x, _ = block_input()
    if sequence_parallel:
        x = x[:, shard_range(x.shape[SEQ_DIM], rank, world_size)]
    masks = []
    block.attention_dropout.register_forward_hook(lambda _, inputs, out: masks.append((out != 0) | (inputs[0] == 0)))
    torch.manual_seed(region_seed(seed, rank, split=per_rank_seed))
    out = block(x.to(rank_device()))
    return {"mask": masks[0].cpu(), "out": out.detach().cpu()}


def one_process_dropout(seed: int = 5) -> dict:
    """``dropout_masks`` of the unsplit block in one process, seeded with ``seed``."""
    block = make_block(dropout=0.5)
    masks = []
    block.attention_dropout.register_forward_hook(lambda _, inputs, out: masks.append((out != 0) | (inputs[0] == 0)))
    torch.manual_seed(seed)
    out = block(block_input()[0])
    return {"mask": masks[0], "out": out.detach()}


def expected_piece(name: str, full: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """The part of the whole block's parameter ``name`` (or its gradient) rank ``rank`` holds."""
    if name.endswith(("wq.weight", "wk.weight", "wv.weight", "w1.weight", "w3.weight")):
        return full[shard_range(full.shape[0], rank, world_size)]
    if name.endswith(("wo.weight", "w2.weight")):
        return full[:, shard_range(full.shape[1], rank, world_size)]
    return full  # the norms: whole on every rank


def compare_block(results: list[dict], reference: dict, *, sequence_parallel: bool) -> dict:
    """The largest difference of the ranks' pieces to the one process's."""
    n = len(results)
    diff = {"out": 0.0, "input_grad": 0.0, "grads": 0.0}
    for rank, r in enumerate(results):
        for key in ("out", "input_grad"):
            want = reference[key][:, shard_range(reference[key].shape[1], rank, n)] if sequence_parallel \
                else reference[key]
            diff[key] = max(diff[key], (r[key] - want).abs().max().item())
        for name, grad in r["grads"].items():
            want = expected_piece(name, reference["grads"][name], rank, n)
            diff["grads"] = max(diff["grads"], (grad - want).abs().max().item())
    return diff


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.parse_args()
    with distributed() as (info, _):
        for sp in (False, True):
            result = block_worker(info.rank, info.world_size, sp)
            results = [None] * info.world_size
            dist.all_gather_object(results, result)
            if info.is_main:
                diff = compare_block(results, one_process_block(), sequence_parallel=sp)
                ok = max(diff.values()) < 1e-5
                verdict(ok, f"Llama block, tensor parallel{' + sequence parallel' * sp} over "
                            f"{info.world_size} rank(s) equals one process; collectives {result['collectives']}")


if __name__ == "__main__":
    main()
