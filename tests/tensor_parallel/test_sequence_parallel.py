"""Lesson 20: a Llama block split by heads, with and without sequence parallelism; the vocabulary
split; the Llama plan through ``parallelize_module`` and ``loss_parallel``. Each equal to one process.

Covers ``ddp_tutorial.tensor_parallel.sequence_parallel``, ``ddp_tutorial.tensor_parallel.vocab_parallel``,
``ddp_tutorial.tensor_parallel.llama_plan``.
"""

from __future__ import annotations

import pytest
import torch

from ddp_tutorial.launch import spawn
from ddp_tutorial.tensor_parallel.llama_plan import compare_llama, llama_one_process, llama_plan_worker
from ddp_tutorial.tensor_parallel.sequence_parallel import (
    DIM,
    activation_bytes,
    block_worker,
    compare_block,
    dropout_masks,
    one_process_block,
    one_process_dropout,
    region_seed,
)
from ddp_tutorial.tensor_parallel.vocab_parallel import compare_vocab, one_process_vocab, vocab_worker

TOLERANCE = 1e-5  # float32 sums over heads and units in another order (seen: 1e-6)


def block_and_bytes(rank: int, world_size: int) -> dict:
    """TP, TP + SP, and the activation bytes of both, in one launch."""
    return {"tp": block_worker(rank, world_size, False), "sp": block_worker(rank, world_size, True),
            "bytes_tp": activation_bytes(rank, world_size, False), "bytes_sp": activation_bytes(rank, world_size, True)}


@pytest.mark.parametrize("n", [2, 4])
def test_block_split_by_heads_with_and_without_sp_equals_one_process(n):
    results = spawn(block_and_bytes, n, timeout=90, quiet=True)
    reference = one_process_block()
    for key, sp in (("tp", False), ("sp", True)):
        diff = compare_block([r[key] for r in results], reference, sequence_parallel=sp)
        assert max(diff.values()) < TOLERANCE, (key, diff)
    for r in results:
        # two pairs (attention, MLP): f and g are one all-reduce each way; SP makes them
        # all-gather + reduce-scatter, plus one all-reduce per norm for its weight's gradient
        assert r["tp"]["collectives"] == {"allreduce_": 4}
        assert r["sp"]["collectives"] == {"allgather_": 4, "reduce_scatter_": 4, "allreduce_": 2}
        assert r["sp"]["out"].shape == (2, 8 // n, DIM)
        # the norm/dropout regions keep 1/t of TP's bytes; the split linears' the same
        assert r["bytes_sp"]["norm/dropout"] * n == r["bytes_tp"]["norm/dropout"]
        assert r["bytes_sp"]["tensor parallel"] == r["bytes_tp"]["tensor parallel"]


def test_block_bytes_on_one_rank_are_the_whole_block():
    (whole,) = spawn(activation_bytes, 1, timeout=60, quiet=True)
    (r,) = spawn(activation_bytes, 1, args=(True,), timeout=60, quiet=True)
    assert whole == r and whole["norm/dropout"] > 0


def dropout_cases(rank: int, world_size: int) -> dict:
    """TP with one seed; SP with one seed; SP with a seed per rank: in one launch."""
    return {"tp": dropout_masks(rank, world_size, False, False), "sp_same": dropout_masks(rank, world_size, True, False),
            "sp_own": dropout_masks(rank, world_size, True, True)}


def test_dropout_rng_same_seed_where_replicated_own_seed_where_split():
    assert region_seed(5, 1, split=False) == 5 and region_seed(5, 1, split=True) == 5 + 2718 + 1
    results = spawn(dropout_cases, 2, timeout=60, quiet=True)
    reference = one_process_dropout()
    assert (reference["out"] - one_process_block()["out"]).abs().max() > 0.01  # dropout 0.5 does change it
    for r in results:  # TP: the region is whole on every rank, the same draws as one process
        assert torch.equal(r["tp"]["mask"], reference["mask"])
        assert (r["tp"]["out"] - reference["out"]).abs().max() < TOLERANCE
    # SP with one seed: rank 1's positions get rank 0's mask pattern, correlated along the sequence
    assert torch.equal(results[0]["sp_same"]["mask"], results[1]["sp_same"]["mask"])
    # SP with a seed per rank: each rank its own mask
    assert not torch.equal(results[0]["sp_own"]["mask"], results[1]["sp_own"]["mask"])


@pytest.mark.parametrize("n", [2, 4])
def test_vocab_parallel_embedding_and_cross_entropy_equal_one_process(n):
    results = spawn(vocab_worker, n, args=([12, 16],), timeout=60, quiet=True)
    for i, vocab in enumerate((12, 16)):
        assert compare_vocab([r[i] for r in results], one_process_vocab(vocab)) < 1e-12
        assert all(r[i]["loss_collectives"] == 3 for r in results)  # max, sum of exp, target logit


def test_llama_plan_with_loss_parallel_equals_one_process():
    results = spawn(llama_plan_worker, 2, timeout=90, quiet=True)
    assert compare_llama(results, llama_one_process()) < TOLERANCE
    for r in results:
        assert r["local_logits"] == (2, 8, 16)  # half the vocabulary: never gathered
        assert "all_gather_into_tensor" not in r["loss_collectives"] and r["loss_collectives"]
        p = r["placements"]
        assert p["layers.0.attention.wq.weight"] == ["S(0)"] and p["layers.0.attention.wo.weight"] == ["S(1)"]
        assert p["tok_embeddings.weight"] == ["S(0)"] and p["layers.0.attention_norm.weight"] == ["R"]
    assert torch.isfinite(torch.tensor(results[0]["loss"]))
