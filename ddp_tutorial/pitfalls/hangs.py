"""Hangs: what gloo and NCCL do when ranks disagree, and a checklist for when a job hangs.

Used by ``12_debugging_and_pitfalls`` (through ``pitfalls.collectives``) and ``07_ddp_spawn``.

gloo, the CPU backend, checks what it receives and raises on a timeout, so a
mistake becomes a Python error on some rank. NCCL, built for GPUs, runs
collectives asynchronously on a CUDA stream and often cannot:

- it does not compare message sizes: a mismatched collective hangs (or reads
  garbage) instead of failing;
- ``init_process_group`` returns before every rank has joined, because NCCL
  connects at the first collective (``TORCH_DIST_INIT_BARRIER=1`` adds a
  store-based barrier to init, bounded by its timeout; ``device_id=`` makes NCCL
  connect inside init, as the course's launchers do through ``env.bound_device``);
- a collective that outlives the group's timeout is not raised in the caller:
  NCCL's watchdog thread aborts the whole process (``TORCH_NCCL_ASYNC_ERROR_HANDLING``).

So each pitfall demo has a backend it runs on: the machine's backend where the
lesson holds on it, gloo where NCCL would only hang until its watchdog kills the
rank (which teaches nothing and costs the timeout). ``expect(demo, backend)`` is
that choice plus what the demo then shows, in fields a cell can assert, and one
line on what NCCL does: a pure function of the backend, tested for both.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Expected", "DEMOS", "expect", "HANG_CHECKLIST"]


@dataclass(frozen=True)
class Expected:
    """What a demo shows when the machine's backend is ``machine`` (``12_debugging_and_pitfalls``)."""

    machine: str  # the backend the machine would choose: "gloo" or "nccl"
    runs_on: str  # the backend the demo uses there
    kind: str  # what it reports: "error" (a rank failed) or "ok" (results came back)
    says: str  # a substring of the error message, or of every result
    on_nccl: str  # what NCCL does in this situation: the lesson says it on every machine


# demo -> (runs on NCCL too?, (kind, says) on gloo, (kind, says) on nccl, what NCCL does)
_TABLE: dict[str, tuple[bool, tuple[str, str], tuple[str, str], str]] = {
    "extra_collective": (
        False, ("error", "exited with code"), ("error", "exited with code"),
        "NCCL does not compare sizes: the ranks wait in the mismatched all-reduce until the "
        "group's timeout, then NCCL's watchdog aborts the process (no Python exception)"),
    "extra_collective_detail": (
        True, ("ok", "Detected mismatch between collectives"), ("ok", "Detected mismatch between collectives"),
        "the same: DETAIL compares every collective's fingerprint over a gloo helper group first"),
    "skips_barrier": (
        True, ("error", "failed to pass monitoredBarrier"), ("error", "failed to pass monitoredBarrier"),
        "the same: monitored_barrier is gloo-only, so on NCCL it runs on a gloo side group"),
    "joins": (
        False, ("ok", "DistStoreError: wait timeout"), ("ok", "DistStoreError: wait timeout"),
        "when a launcher hosts the store (torchrun, launch.spawn) and there is no device_id, "
        "init_process_group returns before the missing rank joins (NCCL connects at the first "
        "collective, which then hangs); with plain env:// rank 0's own store waits for every rank "
        "and init times out as on gloo; TORCH_DIST_INIT_BARRIER=1 makes init wait and time out, "
        "device_id= makes NCCL connect inside init"),
    "uneven_inputs": (
        False, ("ok", "stuck in"), ("ok", "stuck in"),
        "the all-reduce that no rank joins is not raised: after the group's timeout NCCL's "
        "watchdog aborts the process; Join works the same on NCCL"),
    "ddp_uneven_inputs": (  # ddp_spawn.uneven_inputs without Join (07_ddp_spawn)
        True, ("error", "Timed out"), ("error", "exited with code"),
        "the all-reduce that no rank joins is not raised: after the group's timeout NCCL's "
        "watchdog aborts the process, so the rank exits without a Python exception"),
}
DEMOS = tuple(_TABLE)


def expect(demo: str, machine: str) -> Expected:
    """The backend ``demo`` runs on when the machine's backend is ``machine``, and what it shows there."""
    if demo not in _TABLE:
        raise ValueError(f"unknown demo {demo!r}; choose one of {', '.join(DEMOS)}")
    if machine not in ("gloo", "nccl"):
        raise ValueError(f"machine backend must be 'gloo' or 'nccl', got {machine!r}")
    on_nccl_too, gloo, nccl, what = _TABLE[demo]
    runs_on = machine if on_nccl_too else "gloo"
    kind, says = nccl if runs_on == "nccl" else gloo
    return Expected(machine, runs_on, kind, says, what)


HANG_CHECKLIST = """\
When a distributed job hangs or will not start
 1. Same versions everywhere: python -m ddp_tutorial on each node (torch, CUDA, NCCL, Python).
 2. Every rank started? Count processes per node; WORLD_SIZE = nnodes x nproc_per_node.
 3. Rendezvous reachable: from each node, nc -zv MASTER_ADDR MASTER_PORT; open the
    firewall for that port and for the ports NCCL/gloo pick between nodes.
 4. Right network interface: GLOO_SOCKET_IFNAME=eth0 / NCCL_SOCKET_IFNAME=eth0
    (not lo, docker0 or a VPN); ip addr shows the names.
 5. Logs: NCCL_DEBUG=INFO (NCCL_DEBUG_SUBSYS=INIT,NET), TORCH_CPP_LOG_LEVEL=INFO,
    TORCH_DISTRIBUTED_DEBUG=DETAIL (checks that collectives match on every rank).
 6. Find the missing rank: dist.monitored_barrier(timeout=...) names it (gloo group).
 7. Where is each rank stuck? py-spy dump --pid PID for every rank (pgrep -P <torchrun pid>);
    --native adds the C++ frames. On NCCL the Python stack shows where the rank waits
    (often a later .item() or synchronize), not which collective is stuck: NCCL runs on the
    GPU, driven by a host thread. For that, the NCCL flight recorder:
    TORCH_NCCL_TRACE_BUFFER_SIZE=2000 (newer torch: TORCH_FR_BUFFER_SIZE) records each rank's
    last collectives, TORCH_NCCL_DUMP_ON_TIMEOUT=1 writes them when the watchdog times out
    (one file per rank, at TORCH_NCCL_DEBUG_INFO_TEMP_FILE, newer TORCH_FR_DUMP_TEMP_FILE),
    and torchfrtrace DIR (the trace analyser, torch.distributed.flight_recorder.fr_trace)
    names the collective and the ranks that never joined it. TORCH_NCCL_DESYNC_DEBUG=1
    reports, on a timeout, the rank(s) that did not join.
 8. Finite timeouts: init_process_group(timeout=...) so a hang becomes an error.
 9. Same data length on every rank (DistributedSampler, drop_last) or DDP's Join.
10. After a crash, end stray ranks by id, never by name. Find them by session
    (ps -eo pid,ppid,sid,args), by the port they hold (ss -ltnp), or, for torchrun's
    workers (each its own session, ppid 1 once torchrun died), by job id:
    grep -l TORCHELASTIC_RUN_ID=ID /proc/[0-9]*/environ.
"""
