"""``ddp_tutorial.capstone.chars`` and ``ddp_tutorial.capstone.reference``: the text, the batches, the GPT.

The batches against the text they are cut from; ``CharGPT``'s causality and rotary positions
against what they promise (no position sees a later one; attention scores depend only on
the distance between positions); the reference learns (its first loss is a uniform guess).
"""

from __future__ import annotations

import math

import pytest
import torch

from ddp_tutorial.capstone.chars import ALPHABET, VOCAB, char_batch, corpus, decode, encode
from ddp_tutorial.capstone.reference import GPTRun, make_gpt, sample, train_one_process
from ddp_tutorial.models import rotary


def test_the_text_is_fixed_by_its_seed_and_fits_the_alphabet():
    text = corpus()
    assert corpus() == text and corpus(seed=1) != text and len(text) > 10_000
    assert set(text) <= set(ALPHABET) and VOCAB == 32
    assert decode(encode(text[:200])) == text[:200]
    with pytest.raises(ValueError, match="outside the alphabet"):
        encode("Fox")


def test_a_batch_is_windows_of_the_text_and_its_parts_make_the_whole():
    text = corpus()
    inputs, targets = char_batch(3, 8, 16)
    assert inputs.shape == targets.shape == (8, 16)
    assert torch.equal(inputs[:, 1:], targets[:, :-1])  # the targets are the next characters
    for row, last in zip(inputs, targets[:, -1]):
        assert decode(torch.cat([row, last.reshape(1)])) in text
    parts = [char_batch(3, 8, 16, part=p, parts=4) for p in range(4)]
    assert torch.equal(torch.cat([p[0] for p in parts]), inputs)
    assert not torch.equal(char_batch(4, 8, 16)[0], inputs)
    with pytest.raises(ValueError, match="does not split"):
        char_batch(0, 8, 16, parts=3)


def test_no_position_sees_a_later_one():
    model = make_gpt(GPTRun())
    tokens = char_batch(0, 2, 16)[0]
    changed = tokens.clone()
    changed[:, 10:] = (changed[:, 10:] + 1) % VOCAB
    a, b = model(tokens), model(changed)
    assert torch.allclose(a[:, :10], b[:, :10], atol=1e-12) and not torch.allclose(a[:, 10:], b[:, 10:])


def test_rotary_scores_depend_only_on_the_distance():
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 1, 1, 8, generator=g, dtype=torch.float64), torch.randn(1, 1, 1, 8, generator=g,
                                                                                 dtype=torch.float64)
    score = lambda i, j: (rotary(q, offset=i) * rotary(k, offset=j)).sum().item()  # noqa: E731  (read beside its uses)
    assert score(5, 2) == pytest.approx(score(13, 10), abs=1e-12)
    assert score(5, 2) != pytest.approx(score(5, 3), abs=1e-6)
    assert rotary(q, offset=7).norm().item() == pytest.approx(q.norm().item(), abs=1e-12)


@pytest.mark.slow  # 60 steps of training (about 25 s); lesson 22's notebook trains it too
def test_the_reference_learns_the_grammar():
    result = train_one_process(GPTRun(dtype=torch.float32, lr=1e-2), 60)
    losses = result["losses"]
    assert abs(losses[0] - math.log(VOCAB)) < 0.3  # a uniform guess at first
    assert sum(losses[-10:]) / 10 < 1.5
    assert sample(result["model"], "the ", 8, seq=16).startswith("the ")
