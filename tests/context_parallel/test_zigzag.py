"""Lesson 20: zig-zag balances causal ring attention; Ulysses gives the same attention by all-to-all.

The work per rank is counted from the schedule ``RingAttention`` follows and checked against the
causal mask counted in one process; Ulysses is compared with SDPA on the whole sequence (the ring's
zig-zag equality is in ``test_ring_attention.py``).

Covers ``ddp_tutorial.context_parallel.zigzag``, ``ddp_tutorial.context_parallel.ulysses``,
``ddp_tutorial.plots.workload``.
"""

from __future__ import annotations

import pytest
import torch

from ddp_tutorial.context_parallel.ring_attention import compare, qkv_inputs, shard_sequence, tolerance
from ddp_tutorial.context_parallel.ulysses import heads_to_seq, seq_to_heads, ulysses_case
from ddp_tutorial.context_parallel.zigzag import causal_scores, scores_per_rank
from ddp_tutorial.launch import spawn


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_zigzag_gives_every_rank_the_same_causal_work(n):
    seq = 48
    contiguous, zigzag = scores_per_rank(n, seq, layout="contiguous"), scores_per_rank(n, seq, layout="zigzag")
    assert sum(contiguous) == sum(zigzag) == causal_scores(seq)  # every unmasked score once, none twice
    assert len(set(zigzag)) == 1
    if n > 1:  # contiguous: the last rank does 2N - 1 times the first rank's blocks (plus the diagonals)
        assert contiguous == sorted(contiguous) and contiguous[-1] > 2 * contiguous[0]
    assert scores_per_rank(n, seq, layout="contiguous", causal=False) == [seq * seq // n] * n


def test_picture_has_a_bar_per_rank_and_layout():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ddp_tutorial.plots import plot_work_per_rank

    work = {layout: scores_per_rank(4, 16, layout=layout) for layout in ("contiguous", "zigzag")}
    ax = plot_work_per_rank(work)
    heights = [round(p.get_height()) for p in ax.patches]
    assert heights == work["contiguous"] + work["zigzag"]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["contiguous", "zigzag"]
    plt.close("all")


def ulysses_worker(rank: int, world_size: int) -> list[dict]:
    """Both masks, and the all-to-all there and back, in one launch."""
    shape = (2, 4, 8, 3)
    x = shard_sequence(torch.arange(2 * 4 * 8 * 3.0).reshape(shape), rank, world_size)
    round_trip = torch.equal(heads_to_seq(seq_to_heads(x)), x)
    heads = seq_to_heads(x).shape
    return [ulysses_case(rank, world_size, shape, causal=c) | {"round_trip": round_trip, "heads_shape": heads}
            for c in (False, True)]


@pytest.mark.parametrize("n", [2, 4])
def test_ulysses_equals_sdpa_output_and_gradients(n):
    shape = (2, 4, 8, 3)
    results = spawn(ulysses_worker, n, timeout=60, quiet=True)
    for i, causal in enumerate((False, True)):
        diff = compare([r[i] for r in results], qkv_inputs(shape, torch.float32), causal=causal)
        assert max(diff.values()) < tolerance(torch.float32), (causal, diff)
    for r in results:
        assert r[0]["round_trip"] and r[0]["heads_shape"] == (2, 4 // n, 8, 3)  # 1/N heads, all positions


def refuse_three_heads(rank: int, world_size: int) -> str:
    try:
        seq_to_heads(torch.zeros(1, 3, 2, 1))
    except ValueError as err:
        return str(err)
    return "accepted"


def test_ulysses_refuses_more_ranks_than_heads_divide():
    assert all("3 heads do not split over 2 ranks" in m for m in spawn(refuse_three_heads, 2, timeout=60, quiet=True))
