"""hangs.expect: which backend each pitfall demo runs on, and what it shows, for gloo and NCCL machines."""

from __future__ import annotations

import pytest

from ddp_tutorial.pitfalls.hangs import DEMOS, HANG_CHECKLIST, expect


@pytest.mark.parametrize("demo", DEMOS)
def test_on_a_cpu_machine_every_demo_runs_on_gloo(demo):
    found = expect(demo, "gloo")
    assert (found.machine, found.runs_on) == ("gloo", "gloo")
    assert found.kind in ("ok", "error") and found.says and found.on_nccl


@pytest.mark.parametrize("demo, runs_on, kind, says", [
    # NCCL checks no sizes: it would hang until its watchdog kills the rank, so the lesson shows gloo
    ("extra_collective", "gloo", "error", "exited with code"),
    # DETAIL compares fingerprints over a gloo helper group: the same on NCCL
    ("extra_collective_detail", "nccl", "ok", "Detected mismatch between collectives"),
    # monitored_barrier runs on a gloo side group under NCCL
    ("skips_barrier", "nccl", "error", "failed to pass monitoredBarrier"),
    # NCCL's init returns before the missing rank comes: the lesson shows gloo's timeout
    ("joins", "gloo", "ok", "DistStoreError: wait timeout"),
    ("uneven_inputs", "gloo", "ok", "stuck in"),
    # 06 runs on the machine's backend: NCCL's watchdog aborts the rank, no Python exception
    ("ddp_uneven_inputs", "nccl", "error", "exited with code"),
])
def test_on_a_gpu_machine(demo, runs_on, kind, says):
    found = expect(demo, "nccl")
    assert (found.machine, found.runs_on, found.kind, found.says) == ("nccl", runs_on, kind, says)


def test_where_a_demo_runs_on_gloo_anyway_it_shows_what_it_shows_on_a_cpu_machine():
    for demo in DEMOS:
        on_gpu, on_cpu = expect(demo, "nccl"), expect(demo, "gloo")
        if on_gpu.runs_on == "gloo":
            assert (on_gpu.kind, on_gpu.says) == (on_cpu.kind, on_cpu.says)
        assert on_gpu.on_nccl == on_cpu.on_nccl  # the lesson says it on every machine


def test_the_nccl_differences_are_named():
    assert "watchdog" in expect("extra_collective", "nccl").on_nccl
    assert "TORCH_DIST_INIT_BARRIER" in expect("joins", "nccl").on_nccl
    assert "plain env://" in expect("joins", "nccl").on_nccl  # rank 0's own store waits inside init
    assert "watchdog" in expect("ddp_uneven_inputs", "nccl").on_nccl


def test_unknown_demo_or_backend_is_refused():
    with pytest.raises(ValueError, match="unknown demo 'nope'"):
        expect("nope", "gloo")
    with pytest.raises(ValueError, match="'gloo' or 'nccl'"):
        expect("joins", "cpu:gloo,cuda:nccl")


def test_the_checklist_lives_here_and_names_nccl_switches():
    assert "NCCL_DEBUG=INFO" in HANG_CHECKLIST and "monitored_barrier" in HANG_CHECKLIST
    for needed in ("TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_NCCL_DUMP_ON_TIMEOUT", "fr_trace",
                   "TORCH_NCCL_DESYNC_DEBUG", "py-spy dump --pid PID", "--native"):
        assert needed in HANG_CHECKLIST, needed
