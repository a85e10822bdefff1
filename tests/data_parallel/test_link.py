"""ddp_tutorial.data_parallel.link: the all-reduce is the real one, the wire time is added and queued in order."""

from __future__ import annotations

import time

import pytest
import torch

from ddp_tutorial.data_parallel.link import SimulatedLink
from ddp_tutorial.launch import spawn

pytestmark = pytest.mark.timeout(120)


def test_wire_seconds_is_the_ring_volume_over_the_bandwidth():
    link = SimulatedLink(bandwidth=1e6, latency=1e-3)
    assert link.wire_seconds(1000, 1) == 0.0  # nobody to talk to
    assert link.wire_seconds(1000, 2) == pytest.approx(1e-3 + 1000 / 1e6)  # 2 (N-1)/N = 1
    assert link.wire_seconds(1000, 4) == pytest.approx(1e-3 + 1.5 * 1000 / 1e6)
    link.close()


def through_the_link(rank: int, world_size: int) -> dict:
    link = SimulatedLink(bandwidth=1e6)  # 4 KB messages: 4 ms each on the wire
    tensors = [torch.full((1024,), float(rank + i)) for i in range(3)]
    start = time.perf_counter()
    works = [link.all_reduce(t, async_op=True) for t in tensors]
    for w in works:
        w.wait()
    elapsed = time.perf_counter() - start
    future = link.all_reduce(torch.ones(2), async_op=True).get_future()
    from_future = future.wait().tolist()
    blocking = torch.ones(4)
    assert link.all_reduce(blocking) is None
    link.close()
    kinds = [kind for kind, _, _ in link.events]
    return {"values": [t[0].item() for t in tensors], "blocking": blocking.tolist(), "future": from_future, "kinds": kinds,
            "elapsed": elapsed, "wire": 3 * link.wire_seconds(4096, world_size)}


def test_the_link_reduces_for_real_and_holds_the_wire_one_message_at_a_time():
    for result in spawn(through_the_link, 2, timeout=60):
        assert result["values"] == [1.0, 3.0, 5.0]  # tensor i holds rank + i: summed, 2 i + 1
        assert result["blocking"] == [2.0] * 4 and result["future"] == [2.0] * 2
        # five messages, each on and off the wire before the next one goes on: one at a time
        assert result["kinds"].count("send") == 5
        assert [k for k in result["kinds"] if k != "send"] == ["on wire", "off wire"] * 5
        # a sleep never ends early: the messages queued, so waiting took at least their wire time
        assert result["elapsed"] >= result["wire"]

