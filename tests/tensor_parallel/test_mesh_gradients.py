"""Exercise 15.2's premises, in one process: the pieces it hands out are section 6's, and the mean of the dp
shares' gradients is the whole batch's (so averaging over dp, and only dp, is the right answer).

Covers ``ddp_tutorial.exercises.checks.mesh_gradients`` (its diagnoses are tested by
tests/exercises/exercise_mistakes_15.py, its reference solution by test_exercises.py).
"""

from __future__ import annotations

import pytest
import torch

from ddp_tutorial.exercises.checks.mesh_gradients import D_IN, D_OUT, HIDDEN_PER_TP, ROWS_PER_DP, cut, model_grads
from ddp_tutorial.tensor_parallel.device_mesh import local_block

# ColwiseParallel on net1 and RowwiseParallel on net2 (device_mesh.tp_plan), as str() of the placements reads
PLACEMENTS = {"net1.weight": "S(0)", "net1.bias": "S(0)", "net2.weight": "S(1)", "net2.bias": "R"}


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_each_piece_is_the_block_the_lesson_places_on_that_tp_rank(tp):
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(4, D_IN, generator=g, dtype=torch.float64), torch.randn(4, D_OUT, generator=g, dtype=torch.float64)
    whole = model_grads(7, HIDDEN_PER_TP * tp, x, y)
    for index in range(tp):
        pieces = cut(whole, index)
        for name, placement in PLACEMENTS.items():
            shape, offset = local_block(whole[name].shape, [placement], [index], [tp])
            block = whole[name][tuple(slice(o, o + s) for o, s in zip(offset, shape))]
            assert torch.equal(pieces[name], block), (name, index)


@pytest.mark.parametrize("dp", [2, 3])
def test_the_mean_of_the_dp_shares_gradients_is_the_whole_batchs(dp):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(dp * ROWS_PER_DP, D_IN, generator=g, dtype=torch.float64)
    y = torch.randn(dp * ROWS_PER_DP, D_OUT, generator=g, dtype=torch.float64)
    whole = model_grads(3, 4, x, y)
    shares = [model_grads(3, 4, x[i * ROWS_PER_DP:(i + 1) * ROWS_PER_DP], y[i * ROWS_PER_DP:(i + 1) * ROWS_PER_DP])
              for i in range(dp)]
    for name, want in whole.items():
        mean = sum(s[name] for s in shares) / dp
        assert torch.allclose(mean, want, rtol=1e-12, atol=1e-14), name
        assert not torch.allclose(shares[0][name], want), name  # a share alone is not the answer
