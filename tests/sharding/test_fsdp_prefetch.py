"""FSDP2's prefetch and reshard controls (``ddp_tutorial.sharding.fsdp_prefetch``): the all-gathers each one
changes, counted from FSDP2's unshards, and the same bits as the default and as one process."""

from __future__ import annotations

import pytest

from ddp_tutorial.launch import spawn
from ddp_tutorial.sharding.fsdp_prefetch import SETTINGS, prefetch_report
from ddp_tutorial.sharding.zero3_train import TOLERANCES

# (forward, backward) all-gathers per step of a 2-block model: forward gathers the root (embedding, norm,
# head) and each block once; backward gathers again what forward resharded, and nothing else
EXPECTED = {"default": (3, 2), "last block kept (torchtitan)": (3, 1), "root resharded too": (3, 3),
            "never resharded": (3, 0), "reshard to 2 ranks": (3, 2), "forward prefetch, 2 ahead": (3, 2),
            "root unshard(async_op=True)": (3, 2)}


@pytest.mark.slow  # make test stays under 12 minutes; make test-slow and CI run it
@pytest.mark.timeout(150)
def test_prefetch_and_reshard_settings_on_4_ranks():
    assert set(EXPECTED) == set(SETTINGS)
    results = spawn(prefetch_report, 4, timeout=130)
    for rank, report in enumerate(results):
        assert len({r["digest"] for r in report.values()}) == 1  # the same bits whatever the setting
        for name, r in report.items():
            assert (r["forward gathers"], r["backward gathers"]) == EXPECTED[name], (rank, name, r)
            assert r["gap"] <= TOLERANCES[None], (name, r["gap"])
            sizes = {"reshard to 2 ranks": [2], "never resharded": []}.get(name, [4])
            assert r["backward group sizes"] == sizes, (name, r)
        order = [event[:2] for event in report["forward prefetch, 2 ahead"]["events"]]
        # explicit prefetch: block 1's gather is issued before block 0 computes (the default waits for block 0)
        assert order.index(("all-gather", "blocks.1")) < order.index(("computes", "blocks.0"))
        default = [event[:2] for event in report["default"]["events"]]
        assert default.index(("all-gather", "blocks.1")) > default.index(("computes", "blocks.0"))
        # unshard(async_op=True): the root's gather is issued before the batch is ready, not after
        early = [event[:2] for event in report["root unshard(async_op=True)"]["events"]]
        assert early.index(("all-gather", "(root)")) < early.index(("batch ready", ""))
        assert default.index(("all-gather", "(root)")) > default.index(("batch ready", ""))
