"""Lesson 20: the Llama block's grouped-query attention and rotary positions, the ``tp | n_kv_heads``
rule, the tensor-parallel activation bytes that stay whole, and ``ignore_index`` in the
vocabulary-parallel loss.

Covers ``ddp_tutorial.models.llama``, ``ddp_tutorial.tensor_parallel.sequence_parallel`` (GQA, bytes)
and ``ddp_tutorial.tensor_parallel.vocab_parallel`` (padding).
"""

from __future__ import annotations

import pytest
import torch

from ddp_tutorial.context_parallel.ring_attention import shard_sequence
from ddp_tutorial.launch import spawn
from ddp_tutorial.models import LlamaAttention, rotary, tp_heads
from ddp_tutorial.tensor_parallel.sequence_parallel import DIM, HEADS, KV_HEADS, activation_bytes, block_input
from ddp_tutorial.tensor_parallel.vocab_parallel import PADDED, vocab_inputs


def test_tp_must_divide_the_kv_heads():
    assert tp_heads(8, 4, 2) == (4, 2) and tp_heads(8, 4, 4) == (2, 1)
    with pytest.raises(ValueError, match=r"needs tp \| n_kv_heads, but there are 4 K/V heads"):
        tp_heads(8, 4, 8)
    with pytest.raises(ValueError, match="do not share"):
        LlamaAttention(16, 4, 3)


def test_grouped_query_attention_equals_attention_with_each_kv_head_copied():
    torch.manual_seed(0)
    gqa = LlamaAttention(16, 4, 2)  # head_dim 4: 2 query heads per K/V head
    mha = LlamaAttention(16, 4)
    with torch.no_grad():
        mha.wq.weight.copy_(gqa.wq.weight)
        mha.wo.weight.copy_(gqa.wo.weight)
        for big, small in ((mha.wk, gqa.wk), (mha.wv, gqa.wv)):  # K/V head j's rows serve query heads 2j, 2j+1
            big.weight.copy_(small.weight.view(2, 4, 16).repeat_interleave(2, dim=0).reshape(16, 16))
    x = torch.randn(2, 6, 16)
    assert gqa.wk.weight.shape == (8, 16) and (gqa(x) - mha(x)).abs().max() < 1e-6


def test_rotary_of_zigzag_chunks_with_their_true_offsets_equals_the_whole():
    x = torch.randn(1, 2, 16, 4)
    whole = rotary(x)
    n, c = 2, 4  # zig-zag over 2 ranks: rank 0 holds chunks 0 and 3 of 4
    mine = shard_sequence(x, 0, n, "zigzag")
    rotated = torch.cat([rotary(mine[:, :, :c], offset=0), rotary(mine[:, :, c:], offset=3 * c)], dim=2)
    assert torch.allclose(rotated, shard_sequence(whole, 0, n, "zigzag"), atol=1e-6)
    assert not torch.allclose(rotary(mine), rotated)  # positions 0..7 for a rank's chunks: wrong


def test_tensor_parallel_bytes_are_a_whole_part_plus_a_split_part():
    tp = {t: spawn(activation_bytes, t, timeout=60, quiet=True)[0]["tensor parallel"] for t in (1, 2, 4)}
    split = 2 * (tp[1] - tp[2])  # W + R/t at t = 1, 2
    whole = tp[1] - split
    assert tp[4] == whole + split // 4
    x, _ = block_input(seq=16)
    column_inputs = 2 * x.numel() * 4  # the attention's and the MLP's normed inputs, float32, whole on every rank
    rotary_tables = 4 * 16 * (DIM // HEADS // 2) * 4  # cos and sin, for q and for k
    assert whole == column_inputs + rotary_tables, (whole, column_inputs, rotary_tables)
    assert KV_HEADS < HEADS


def test_padding_rows_are_in_the_vocab_inputs():
    targets = vocab_inputs()["targets"]
    assert (targets[-PADDED:] == -100).all() and (targets[:-PADDED] >= 0).all()
    logits = vocab_inputs()["logits"]
    ignored = torch.nn.functional.cross_entropy(logits, targets)
    assert ignored == torch.nn.functional.cross_entropy(logits[:-PADDED], targets[:-PADDED])
