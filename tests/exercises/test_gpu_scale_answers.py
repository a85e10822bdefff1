"""Exercises 23.5-23.7's references, in one process, held against the course's own models: 23.5's bytes per
GPU against ``sharding.calculator.bytes_per_rank``, 23.6's ratio against ``stepmodel.tp_seconds`` over
``flops.training_flops``; and the cases keep each answer well defined (a floor away from a whole number, a
limit that each typical mistake moves).

Covers ``ddp_tutorial.exercises.checks.lesson_how_fast_limits`` and ``ddp_tutorial.exercises.checks.tp_bound``
(their diagnoses are tested by tests/exercises/exercise_mistakes_23_limits.py, their reference solutions by
test_exercises.py).
"""

from __future__ import annotations

import math
from fractions import Fraction

import pytest

from ddp_tutorial.exercises.checks import tp_bound
from ddp_tutorial.exercises.checks.lesson_how_fast_limits import FIT_CASES, GIB, most_params, per_parameter
from ddp_tutorial.performance.flops import TransformerShape, training_flops
from ddp_tutorial.performance.hardware import Hardware
from ddp_tutorial.performance.stepmodel import StepLayout, tp_seconds
from ddp_tutorial.sharding.calculator import ModelShape, bytes_per_rank, num_params

STATES = ("parameters", "gradients", "optimizer states")
# shapes whose parameters split evenly over tp 1, 2, 4 and dp 1, 2, 4, 8; an even number of layers for pp 2
SHAPES = [ModelShape(layers=4, hidden=256, heads=4, vocab=512, seq=64),
          ModelShape(layers=8, hidden=512, heads=8, vocab=1024, seq=128, bias=False, rms_norm=True)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize(("dp", "tp", "pp"), [(1, 1, 1), (8, 1, 1), (4, 2, 1), (2, 4, 2), (8, 2, 2)])
@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_the_bytes_per_gpu_are_the_calculators(shape, dp, tp, pp, zero):
    layer, outside = num_params(shape)
    n = layer * shape.layers + outside
    held = bytes_per_rank(shape, dp=dp, tp=tp, pp=pp, zero=zero, precision="bf16-mixed")
    want = sum(held[k] for k in STATES)
    got = n * per_parameter(gpus=dp * tp * pp, tp=tp, pp=pp, zero=zero)
    assert got == want, (got, want)
    # that many bytes fit exactly n parameters, one byte less n - 1 at most
    assert math.floor(most_params(want / GIB, 0, gpus=dp * tp * pp, tp=tp, pp=pp, zero=zero)) == n
    assert math.floor(most_params((want - 1) / GIB, 0, gpus=dp * tp * pp, tp=tp, pp=pp, zero=zero)) < n


def test_each_fit_case_is_a_floor_away_from_a_whole_number_and_one_rounds_up():
    fractions = []
    for _, memory, reserve, gpus, tp, pp, zero in FIT_CASES:
        for exact in (most_params(memory, reserve, gpus=gpus, tp=tp, pp=pp, zero=zero),  # the floats given
                      (Fraction(str(memory)) - reserve) * GIB / per_parameter(gpus=gpus, tp=tp, pp=pp, zero=zero)):
            part = exact - math.floor(exact)
            assert Fraction(1, 100) <= part <= Fraction(99, 100), exact
        fractions.append(part)
    assert any(part > Fraction(1, 2) for part in fractions)  # round() differs from the floor somewhere


def hardware(layer: tuple) -> Hardware:
    _, _, _, _, _, _, rate, link, alpha = layer
    keys = ("peak_flops", "achievable_flops", "hbm_bytes_per_s", "nvlink_bytes_per_s", "network_bytes_per_s",
            "latency_s")
    return Hardware("the case's", rate, rate, 1e12, link, 1e9, alpha, sources=dict.fromkeys(keys, "the case"))


@pytest.mark.parametrize("key", sorted(tp_bound.LAYERS))
@pytest.mark.parametrize("t", range(1, 9))
def test_the_ratio_is_the_step_models_tp_seconds_over_the_layers_flops(key, t):
    layer = tp_bound.LAYERS[key]
    _, dim, seq, heads, b, params, rate, _, _ = layer
    one, two = (TransformerShape(vocab=64, dim=dim, layers=n, heads=heads, seq=seq) for n in (1, 2))
    assert one.layer_params == params
    flops = training_flops(two, b * seq).model - training_flops(one, b * seq).model  # one layer, the head cancels
    comm = tp_seconds(one, StepLayout(tp=t, micro_batch=b), hardware(layer))  # one layer, one microbatch, NVLink
    assert math.isclose(tp_bound.right(t, layer), comm / (flops / t / rate), rel_tol=1e-12, abs_tol=0)


def test_the_ratio_grows_with_t_so_the_limit_is_where_it_passes_1():
    for layer in tp_bound.LAYERS.values():
        ratios = [tp_bound.right(t, layer) for t in range(1, 9)]
        assert ratios == sorted(ratios) and ratios[0] == 0
    limits = [tp_bound.limit(tp_bound.LAYERS[key], lambda t, k=key: tp_bound.right(t, tp_bound.LAYERS[k]))
              for key in tp_bound.LIMIT_CASES]
    assert limits == [4, 6, 8]


def test_each_single_mistake_moves_some_limit():
    moved = set()
    for key in tp_bound.LIMIT_CASES:
        layer = tp_bound.LAYERS[key]
        want = tp_bound.limit(layer, lambda t: tp_bound.right(t, layer))
        moved |= {words for options in tp_bound.ratio_knobs().values() for words, _ in options[1:]
                  if tp_bound.limit(layer, lambda t, w=words: tp_bound.with_mistake(t, layer, w)) != want}
    every = {words for options in tp_bound.ratio_knobs().values() for words, _ in options[1:]}
    assert moved == every, every - moved
