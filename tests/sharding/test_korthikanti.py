"""Korthikanti et al. (2022) Table 2, every row, against the bytes the course's own block saves, and the paper's GPT-3 figure.

Covers ``calculator.korthikanti`` and the ``tp``/``sp``/``recompute`` terms of ``calculator.bytes_per_rank``.
The independent side: ``activations.saved_tensors`` records what a bf16 ``models.Block`` saves, tensor by
tensor, with the module it ran in; Megatron's layout says which of those tensors tensor parallelism
leaves whole on each rank (the norms, the dropouts after proj and down, the inputs of qkv and up:
§4.2.2) and which it splits ``t`` ways. CPU's dropout keeps a 2-byte mask in bf16 where CUDA's
(and the paper's) keeps 1 byte: those are halved; the LayerNorm statistics are not in the paper.
"""

from __future__ import annotations

import pytest
import torch

from ddp_tutorial.models import Block
from ddp_tutorial.sharding.activations import saved_tensors
from ddp_tutorial.sharding.calculator import ModelShape, activation_terms, bytes_per_rank, korthikanti

SHAPES = [(2, 12, 32, 4), (1, 16, 24, 3)]  # (batch, seq, hidden, heads)


def measured(batch: int, seq: int, hidden: int, heads: int) -> dict[str, int]:
    """What one bf16 block saves, split as Megatron's tensor parallelism holds it, masks at 1 byte."""
    torch.manual_seed(0)
    block = Block(hidden, heads, dropout=0.1, attention="math").to(torch.bfloat16)
    x = torch.randn(batch, seq, hidden, dtype=torch.bfloat16, requires_grad=True)
    with saved_tensors(block) as record:
        block(x)
    out = {"whole": 0, "split": 0, "a·s²": 0}
    for item in record.items:
        if item.op == "layer_norm" and item.shape[-1:] == (1,):
            continue  # the statistics: not in the paper
        nbytes = item.nbytes // 2 if item.op == "dropout" else item.nbytes  # a 1-byte mask, as on CUDA
        if item.numel == batch * heads * seq * seq:
            out["a·s²"] += nbytes
        elif item.layer in ("norm1", "norm2", "qkv", "up") or item.op == "dropout":
            out["whole"] += nbytes  # the norms' inputs, qkv's and up's inputs, the h-wide dropout masks
        else:
            out["split"] += nbytes  # q, k, v, proj's and down's inputs, GELU's input
    return out


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("tp", [1, 2, 4])
def test_every_row_of_table_2_equals_the_measured_block(shape, tp):
    b, s, h, a = shape
    got = measured(*shape)
    sbh = s * b * h
    assert got["whole"] == 10 * sbh and got["split"] == 24 * sbh  # the paper's 10 and 24 (§4.2.2)
    assert got["a·s²"] == 5 * a * s * s * b
    rows = {  # per rank: what is split goes t ways, what is whole stays
        ("none", False): got["whole"] + (got["split"] + got["a·s²"]) / tp,
        ("none", True): (got["whole"] + got["split"] + got["a·s²"]) / tp,
        ("selective", False): got["whole"] + got["split"] / tp,
        ("selective", True): (got["whole"] + got["split"]) / tp,
        ("full", False): 2 * sbh,  # the block's input, in bf16
    }
    for (recompute, sp), want in rows.items():
        assert korthikanti(s, b, h, a, tp=tp, sp=sp, recompute=recompute) == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("tp", [1, 2, 4])
def test_the_calculator_adds_table_2_up_over_layers(shape, tp):
    b, s, h, a = shape
    layers, vocab = 3, 64
    model = ModelShape(layers=layers, hidden=h, heads=a, vocab=vocab, seq=s)
    stats = 16 * b * s  # the LayerNorms' float32 statistics, per layer
    tail = 2 * 2 * b * s * h + 8 * b * s  # the final norm's input and statistics, and the head's input
    loss = 4 * b * s * vocab + 4  # the float32 log-softmax and its total weight: split by vocabulary
    for sp in (False, True):
        for recompute in ("none", "selective"):
            got = bytes_per_rank(model, micro_batch=b, tp=tp, sp=sp, recompute=recompute, attention="math",
                                 dropout=True, mask_bytes=1)["activations"]
            whole = 1 if sp or tp == 1 else tp  # what tensor parallelism without sp leaves whole
            table = korthikanti(s, b, h, a, tp=tp, sp=sp, recompute=recompute)
            want = layers * (table + stats * whole / tp) + (tail * whole + loss) / tp
            assert got == pytest.approx(want, abs=1), (sp, recompute)  # one byte of rounding up


def test_selective_saves_70_percent_of_gpt3s_activations():
    # Korthikanti et al. §4.3: for GPT-3 (a = 96, s = 2048, h = 12288) selective recomputation cuts the
    # activation memory by 70%, because 5as/h = 80 against 34
    gpt3 = ModelShape(layers=96, hidden=12288, heads=96, vocab=51200, seq=2048)
    options = {"attention": "math", "dropout": True, "mask_bytes": 1}
    none = sum(activation_terms(gpt3, 1, **options).values())
    selective = sum(activation_terms(gpt3, 1, recompute="selective", **options).values())
    assert round(1 - selective / none, 2) == 0.70
    with pytest.raises(ValueError, match="Table 2"):
        korthikanti(2048, 1, 12288, 96, recompute="keep-matmuls")
