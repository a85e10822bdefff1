"""The vocabulary split over ranks: an embedding and a cross-entropy that never gather it (``20_long_sequences``).

An LLM's largest matrices are often the token embedding and the output head, ``vocab x dim``
each. Split by vocabulary rows, rank ``r`` holds tokens ``r V/t .. (r+1) V/t``:

- **embedding**: each rank looks up the tokens it holds and writes zeros for the others;
  an all-reduce (Megatron's ``g``) adds the ranks' rows into every token's vector;
- **cross-entropy** on logits split by vocabulary ``(N, V/t)``: ``log sum_v exp(z_v) - z_target``
  needs three numbers per row, each a reduction over the vocabulary: the maximum (for a
  stable exp), the sum of exponentials and the target's logit (found on one rank only):
  three all-reduces of ``N`` numbers instead of gathering ``N x V`` logits. The gradient,
  ``softmax - onehot``, is computed on each rank's own columns with no communication. Rows
  whose target is ``ignore_index`` (-100, padding) are left out of the mean, as in torch.

This is what ``torch.distributed.tensor.parallel.loss_parallel`` does for a DTensor of logits
sharded on the vocabulary (``llama_plan``).

    torchrun --nproc-per-node=2 -m ddp_tutorial.tensor_parallel.vocab_parallel   # equal to F.embedding / F.cross_entropy
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist

from ddp_tutorial.env import distributed, rank_device
from ddp_tutorial.launch.verdict import verdict
from ddp_tutorial.tensor_parallel.split_mlp import g, shard_range

__all__ = ["vocab_parallel_embedding", "VocabParallelCrossEntropy", "vocab_parallel_cross_entropy",
           "vocab_case", "vocab_worker", "main"]


def vocab_parallel_embedding(tokens: torch.Tensor, weight_shard: torch.Tensor, *, vocab: int,
                             group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """``F.embedding(tokens, weight)`` with ``weight``'s rows split over ``group``: ``weight_shard`` is mine."""
    mine = shard_range(vocab, dist.get_rank(group), dist.get_world_size(group))
    held = (tokens >= mine.start) & (tokens < mine.stop)
    local = torch.nn.functional.embedding((tokens - mine.start) * held, weight_shard)  # others: row 0, then zeroed
    return g(local * held.unsqueeze(-1), group)  # each token's vector lives on one rank: the sum is it


class VocabParallelCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy of logits split by vocabulary, three all-reduces of one number per row.

    Rows whose target is ``ignore_index`` (padding) count for nothing, as in ``F.cross_entropy``:
    the mean is over the other rows.
    """

    @staticmethod
    def forward(ctx, logits: torch.Tensor, targets: torch.Tensor, group: dist.ProcessGroup | None,
                ignore_index: int = -100) -> torch.Tensor:
        n, part = logits.shape
        start = dist.get_rank(group) * part
        top = logits.max(dim=-1).values  # the max's gradient is not needed: it cancels in the loss
        dist.all_reduce(top, op=dist.ReduceOp.MAX, group=group)
        shifted = logits - top.unsqueeze(-1)
        exp = shifted.exp()
        total = exp.sum(dim=-1)
        dist.all_reduce(total, group=group)
        counted = targets != ignore_index
        held = (targets >= start) & (targets < start + part) & counted
        index = ((targets - start) * held).unsqueeze(-1)
        target_logit = shifted.gather(-1, index).squeeze(-1) * held  # zero where another rank holds it
        dist.all_reduce(target_logit, group=group)
        rows = counted.sum()  # the same on every rank: the targets are
        ctx.save_for_backward(exp / total.unsqueeze(-1), index, held, counted, rows)
        return ((total.log() - target_logit) * counted).sum() / rows

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        softmax, index, held, counted, rows = ctx.saved_tensors
        onehot = torch.zeros_like(softmax).scatter_(-1, index, held.unsqueeze(-1).to(softmax.dtype))
        # my columns only: no communication; an ignored row gets no gradient
        return (softmax - onehot) * counted.unsqueeze(-1) * grad / rows, None, None, None


def vocab_parallel_cross_entropy(logits_shard: torch.Tensor, targets: torch.Tensor, *,
                                 group: dist.ProcessGroup | None = None, ignore_index: int = -100) -> torch.Tensor:
    """``F.cross_entropy(logits, targets, ignore_index=...)`` (the mean) from this rank's vocabulary
    columns ``(N, V/t)``."""
    return VocabParallelCrossEntropy.apply(logits_shard, targets, group, ignore_index)


PADDED = 2  # rows of padding in every batch of ``vocab_inputs``


def vocab_inputs(vocab: int = 12, dim: int = 4, rows: int = 10, seed: int = 0) -> dict[str, torch.Tensor]:
    """A table, tokens, logits and targets from ``seed``: every rank and the one process draw the same.

    The last ``PADDED`` targets are ``-100``, padding: ``F.cross_entropy``'s default ``ignore_index``.
    """
    gen = torch.Generator().manual_seed(seed)
    targets = torch.randint(0, vocab, (rows,), generator=gen)
    targets[-PADDED:] = -100
    return {"weight": torch.randn(vocab, dim, generator=gen, dtype=torch.float64),
            "tokens": torch.randint(0, vocab, (2, rows // 2), generator=gen),
            "logits": 3 * torch.randn(rows, vocab, generator=gen, dtype=torch.float64),
            "targets": targets}


def vocab_case(rank: int, world_size: int, vocab: int = 12) -> dict:
    """This rank's embedding output, loss and gradient shards for ``vocab_inputs``."""
    from torch.distributed.tensor.debug import CommDebugMode

    device, inputs = rank_device(), vocab_inputs(vocab)
    mine = shard_range(vocab, rank, world_size)
    weight = inputs["weight"][mine].to(device).requires_grad_()
    logits = inputs["logits"][:, mine].to(device).requires_grad_()
    emb = vocab_parallel_embedding(inputs["tokens"].to(device), weight, vocab=vocab)
    emb.pow(2).sum().backward()
    with CommDebugMode() as comms:
        loss = vocab_parallel_cross_entropy(logits, inputs["targets"].to(device))
        loss.backward()
    return {"embedding": emb.detach().cpu(), "weight_grad": weight.grad.cpu(), "loss": loss.item(),
            "logits_grad": logits.grad.cpu(), "loss_collectives": comms.get_total_counts()}


def vocab_worker(rank: int, world_size: int, vocabs: list[int]) -> list[dict]:
    """``vocab_case`` for each vocabulary size in ``vocabs``, in one launch."""
    return [vocab_case(rank, world_size, v) for v in vocabs]


def one_process_vocab(vocab: int = 12) -> dict:
    """``F.embedding`` and ``F.cross_entropy`` on the whole table and logits, with their gradients."""
    inputs = vocab_inputs(vocab)
    weight, logits = inputs["weight"].clone().requires_grad_(), inputs["logits"].clone().requires_grad_()
    emb = torch.nn.functional.embedding(inputs["tokens"], weight)
    emb.pow(2).sum().backward()
    loss = torch.nn.functional.cross_entropy(logits, inputs["targets"])
    loss.backward()
    return {"embedding": emb.detach(), "weight_grad": weight.grad, "loss": loss.item(), "logits_grad": logits.grad}


def compare_vocab(results: list[dict], reference: dict) -> float:
    """The largest difference of any rank's pieces to the one process's."""
    n, vocab = len(results), reference["weight_grad"].shape[0]
    diff = 0.0
    for rank, r in enumerate(results):
        mine = shard_range(vocab, rank, n)
        diff = max(diff, (r["embedding"] - reference["embedding"]).abs().max().item(),
                   (r["weight_grad"] - reference["weight_grad"][mine]).abs().max().item(),
                   abs(r["loss"] - reference["loss"]),
                   (r["logits_grad"] - reference["logits_grad"][:, mine]).abs().max().item())
    return diff


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=12, help="vocabulary size, a multiple of the world size")
    args = parser.parse_args()
    with distributed() as (info, _):
        result = vocab_case(info.rank, info.world_size, args.vocab)
        results = [None] * info.world_size
        dist.all_gather_object(results, result)
    if info.is_main:
        diff = compare_vocab(results, one_process_vocab(args.vocab))
        ok = diff < 1e-12
        verdict(ok, f"vocabulary split over {info.world_size} rank(s): embedding, loss and "
                    f"gradients equal one process (float64); the loss took {result['loss_collectives']} all-reduces")


if __name__ == "__main__":
    main()
