"""ddp_tutorial.data_parallel.unused_parameters: a parameter without a gradient breaks DDP; each fix trains like one process."""

from __future__ import annotations

import pytest
import torch

from ddp_tutorial.data_parallel.unused_parameters import FIXES, train_branchy, train_branchy_single
from ddp_tutorial.launch import spawn

pytestmark = pytest.mark.timeout(120)


def test_an_unused_parameter_skips_the_first_all_reduce_and_fails_the_second_step():
    results = spawn(train_branchy, 2, args=("none", 3), timeout=90)
    for r in results:
        assert r["all_reduces"] == [0]  # step 1: the bucket holding aux never filled, nothing was reduced
        step, message = r["error"]
        assert step == 2 and "Expected to have finished reduction in the prior iteration" in message
        assert "find_unused_parameters" in message
    # each rank stepped with its own gradients: the replicas drifted apart, silently
    assert results[0]["checksum"] != results[1]["checksum"]


@pytest.mark.parametrize("world_size", [2, 3])
def test_every_fix_trains_like_one_process_on_the_global_batch(world_size):
    reference = train_branchy_single(world_size, 3)
    untrained = train_branchy_single(world_size, 0)
    assert all((reference[k] - untrained[k]).abs().max() > 1e-3 for k in reference)  # the steps moved every weight
    for fix in FIXES:
        if fix == "none":
            continue
        results = spawn(train_branchy, world_size, args=(fix, 3), timeout=90)
        for r in results:
            assert r["error"] is None and r["all_reduces"] == [1, 1, 1], (fix, r)
            for name, tensor in reference.items():
                torch.testing.assert_close(r["state"][name], tensor, atol=1e-12, rtol=0)
        assert len({r["checksum"] for r in results}) == 1
