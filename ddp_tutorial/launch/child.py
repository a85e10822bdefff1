"""The rank side of ``launch.spawn``: how ranks are started and what runs inside them."""

from __future__ import annotations

import gc
import io
import multiprocessing as mp
import os
import pickle
import signal
import sys
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from multiprocessing import forkserver as mp_forkserver
from multiprocessing import spawn as mp_spawn
from multiprocessing.connection import Connection

from ddp_tutorial.launch.procs import become_subreaper, kill_descendants
from ddp_tutorial.launch.spec import LaunchSpec

# Imported once by the forkserver, so forked children start with torch loaded.
# torch._dynamo too: DDP and the optimizers import it on first use, which costs
# seconds in every child otherwise.
PRELOAD = ["torch", "torch.distributed", "torch._dynamo", "ddp_tutorial.launch"]


@contextmanager
def children_skip_main() -> Iterator[None]:
    """Children never re-run the caller's ``__main__`` (a script, pytest, the kernel).

    multiprocessing normally re-imports ``__main__`` in each child so that
    functions defined there can be found. ``spawn`` refuses such functions, so the
    re-import would only cost time, and would fail in scripts without an
    ``if __name__ == "__main__":`` guard.
    """
    original = mp_spawn.get_preparation_data

    def prepare(name):
        data = original(name)
        data.pop("init_main_from_path", None)
        data.pop("init_main_from_name", None)
        return data

    mp_spawn.get_preparation_data = prepare
    try:
        yield
    finally:
        mp_spawn.get_preparation_data = original


def context() -> mp.context.BaseContext:
    """A forkserver that preloaded torch where there is one; plain spawn elsewhere."""
    if sys.platform == "win32" or "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx


def is_warm() -> bool:
    """True when the forkserver already runs, torch imported: a launch then starts in milliseconds.

    Read from multiprocessing's own record of its server (``False`` where it keeps none).
    """
    server = getattr(mp_forkserver, "_forkserver", None)
    return sys.platform != "win32" and getattr(server, "_forkserver_pid", None) is not None


def no_op() -> None:
    """What ``launch.warm_up`` runs: a process forked from the forkserver, doing nothing."""


def run_rank(spec: LaunchSpec, rank: int, env: dict, out_path: str, conn: Connection) -> None:
    """Runs in the child: redirect output, set up the group, run the worker, send back the result.

    Two messages go back: ``("ok", result)`` or ``("error", message, traceback, stage)`` as
    soon as the worker is done, then ``("left", [(pid, command), ...])``: what its code left
    running, which this rank stopped before it ended (``procs.kill_descendants``).
    """
    os.setpgrp()  # own process group: the parent can stop this rank and anything it started
    become_subreaper()  # what it starts stays in its tree, even once its parent is gone (see procs)
    # What the forkserver preloaded (torch: about a million objects) lives as long as this
    # process. Frozen, the gc.collect() at teardown skips it: milliseconds instead of 0.1 s.
    gc.freeze()
    out = os.open(out_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(out, 1)
    os.dup2(out, 2)
    # Unbuffered: the parent reads this file while the rank runs, to show it live.
    sys.stdout = io.TextIOWrapper(os.fdopen(1, "wb", buffering=0), encoding="utf-8",
                                  errors="replace", write_through=True)
    sys.stderr = sys.stdout
    os.environ.clear()  # a forkserver child has the server's environment: use the caller's
    os.environ.update(env)
    import torch
    import torch.distributed as dist

    torch.set_num_threads(spec.threads)

    def report(status: tuple) -> None:
        sys.stdout.flush()
        try:
            payload = pickle.dumps(status)
        except Exception as exc:
            payload = pickle.dumps(("error", f"the return value of rank {rank} cannot be pickled: {exc}", "", "run"))
        conn.send_bytes(payload)

    stage = "init"
    try:
        if spec.init_process_group:
            from ddp_tutorial.env import bound_device, choose_backend, set_device_for

            chosen = spec.backend or choose_backend(local_world_size=spec.world_size)
            device = set_device_for(rank, chosen)
            # A rank through init can finish a quick worker and tear the group down while a
            # peer is still connecting (gloo: "Connection closed by peer"). torch's barrier
            # after init (a counter in the store) lets every rank leave init together.
            caller_choice = os.environ.get("TORCH_DIST_INIT_BARRIER")
            os.environ["TORCH_DIST_INIT_BARRIER"] = "1"
            try:
                dist.init_process_group(chosen, rank=rank, world_size=spec.world_size,
                                        timeout=timedelta(seconds=spec.timeout),
                                        device_id=bound_device(device))
            finally:  # the worker sees the caller's environment
                if caller_choice is None:
                    del os.environ["TORCH_DIST_INIT_BARRIER"]
                else:
                    os.environ["TORCH_DIST_INIT_BARRIER"] = caller_choice
        stage = "run"
        result = spec.fn(rank, spec.world_size, *spec.args)
    except BaseException as exc:  # report everything, even SystemExit, to the parent
        # Report before tearing down: the teardown makes the other ranks fail too,
        # and the parent should hear about the cause first.
        report(("error", f"{type(exc).__name__}: {exc}", traceback.format_exc(), stage))
    else:
        report(("ok", result))
    finally:
        if spec.init_process_group and dist.is_initialized():
            gc.collect()  # free DDP/gloo objects in cycles while the group lives (see env.distributed)
            dist.destroy_process_group()
        # Last, once what ends cleanly has ended (a DataLoader's workers, at the teardown above):
        # torch's SIGCHLD handler would take a DataLoader worker killed here for a crash.
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        left = kill_descendants(os.getpid())
        try:
            conn.send_bytes(pickle.dumps(("left", left)))
            conn.close()
        except OSError:  # the parent stopped listening: it stops what is left itself (spawner._stop)
            pass
