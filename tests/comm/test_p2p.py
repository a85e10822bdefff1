"""ddp_tutorial.comm.p2p (lesson 04): send/recv, isend/irecv, batch_isend_irecv, token ring, deadlocks."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ddp_tutorial.comm import p2p
from ddp_tutorial.launch import WorkerError, WorkerTimeout, spawn, torchrun

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_blocking_send_reaches_every_rank(world_size):
    results = spawn(p2p.send_recv, world_size, timeout=60)
    assert results[0]["before"] == [1.0, 2.0, 3.0]
    assert all(r["before"] == [0.0, 0.0, 0.0] for r in results[1:])
    assert [r["after"] for r in results] == [[1.0, 2.0, 3.0]] * world_size


@pytest.mark.parametrize("world_size", [2, 3])
def test_nonblocking_handles_complete_after_wait(world_size):
    results = spawn(p2p.nonblocking, world_size, timeout=60)
    assert [r["handles"] for r in results] == [world_size - 1] + [1] * (world_size - 1)
    assert all(r["completed"] for r in results)
    assert [r["after"] for r in results] == [[4.0, 5.0, 6.0]] * world_size


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_ring_exchange_receives_the_left_neighbours_value(world_size):
    results = spawn(p2p.ring_exchange, world_size, timeout=60)
    for rank, r in enumerate(results):
        left = (rank - 1) % world_size
        assert (r["sent to"], r["received from"]) == ((rank + 1) % world_size, left)
        assert r["received"] == 10.0 * left


def _token_reference(world_size: int, laps: int) -> dict:
    """Simulate the token in one process: hop h is sent by rank (h-1) % n, carrying value h."""
    sends = {rank: [] for rank in range(world_size)}
    for hop in range(1, laps * world_size + 1):
        src = (hop - 1) % world_size
        sends[src].append((hop, (src + 1) % world_size, float(hop)))
    return sends


@pytest.mark.parametrize("world_size,laps", [(2, 1), (3, 2), (4, 3)])
def test_token_ring_matches_a_one_process_simulation(world_size, laps):
    results = spawn(p2p.pass_token, world_size, args=(laps,), timeout=60)
    reference = _token_reference(world_size, laps)
    assert [r["sends"] for r in results] == [reference[rank] for rank in range(world_size)]
    assert results[0]["final"] == float(laps * world_size)
    assert all(r["final"] is None for r in results[1:])


@pytest.mark.parametrize("worker", [p2p.ring_exchange, p2p.pass_token])
def test_a_ring_of_one_is_refused(worker):
    with pytest.raises(WorkerError, match="at least 2 ranks"):
        spawn(worker, 1, timeout=60)


@pytest.mark.parametrize("order", ["send-first", "recv-first"])
def test_blocking_in_the_same_order_deadlocks_and_times_out(order):
    results = spawn(p2p.swap, 2, args=(order, 1.5), init_process_group=False, timeout=60)
    stuck_in = order.split("-")[0]
    assert [r["outcome"] for r in results] == [f"stuck in {stuck_in}"] * 2


@pytest.mark.parametrize("order", ["by-parity", "nonblocking", "batched"])
@pytest.mark.parametrize("world_size", [2, 4])
def test_the_three_fixes_swap_pairs(order, world_size):
    results = spawn(p2p.swap, world_size, args=(order, 30.0), init_process_group=False, timeout=60)
    assert [r["outcome"] for r in results] == [f"got {rank ^ 1}" for rank in range(world_size)]


def test_a_deadlock_without_group_timeout_is_a_worker_timeout():
    with pytest.raises(WorkerTimeout) as caught:
        spawn(p2p.swap, 2, args=("recv-first", 60.0), init_process_group=False, timeout=2)
    assert caught.value.ranks == [0, 1]


def test_swap_rejects_bad_arguments():
    with pytest.raises(WorkerError, match="unknown order 'sideways'"):
        spawn(p2p.swap, 2, args=("sideways",), init_process_group=False, timeout=45)
    with pytest.raises(WorkerError, match="world_size must be even"):
        spawn(p2p.swap, 3, args=("batched",), init_process_group=False, timeout=45)


def test_module_alone_fails_with_one_line():
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    proc = subprocess.run([sys.executable, "-m", "ddp_tutorial.comm.p2p"], capture_output=True, text=True,
                          timeout=90, env=env, cwd=Path(__file__).parent)
    assert proc.returncode == 2  # a usage error, as argparse's
    assert proc.stderr.strip().splitlines() == [
        "python -m ddp_tutorial.comm.p2p: error: needs at least 2 ranks (a message needs a receiver), got 1; "
        "start it with torchrun --nproc-per-node=2 -m ddp_tutorial.comm.p2p"]
    assert proc.stdout == ""


@pytest.mark.slow  # a torchrun command: make test-slow (CI)
def test_module_under_torchrun_passes_the_token_home():
    result = torchrun("ddp_tutorial.comm.p2p", nproc_per_node=2, timeout=90)
    assert "token came home with value 4: OK" in result.output
    assert "rank 1: passed the token at hops [2, 4]; received 0 from rank 0" in result.output
