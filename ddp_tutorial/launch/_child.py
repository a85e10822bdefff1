"""The child side of ``launch.spawn``: how ranks are started and what runs inside them."""

from __future__ import annotations

import gc
import io
import multiprocessing as mp
import os
import pickle
import sys
import traceback
from contextlib import contextmanager
from datetime import timedelta
from multiprocessing import spawn as mp_spawn

# Imported once by the forkserver, so forked children start with torch loaded.
# torch._dynamo too: DDP and the optimizers import it on first use, which costs
# seconds in every child otherwise.
_PRELOAD = ["torch", "torch.distributed", "torch._dynamo", "ddp_tutorial.launch"]


@contextmanager
def _children_skip_main():
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


def _context() -> mp.context.BaseContext:
    if sys.platform == "win32" or "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(_PRELOAD)
    return ctx


def _child(fn, rank, world_size, args, backend, init_pg, env, out_path, conn, threads, timeout):
    """Runs in the child: redirect output, set up the group, run ``fn``, send back the result."""
    os.setpgrp()  # own process group: the parent can stop this rank and anything it started
    # What the forkserver preloaded (torch: about a million objects) lives as long as this
    # process. Frozen, the gc.collect() at teardown skips it: milliseconds instead of 0.1 s.
    gc.freeze()
    out = os.open(out_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(out, 1)
    os.dup2(out, 2)
    sys.stdout = io.TextIOWrapper(os.fdopen(1, "wb", buffering=0), encoding="utf-8",
                                  errors="replace", write_through=True)
    sys.stderr = sys.stdout
    os.environ.clear()  # a forkserver child has the server's environment: use the caller's
    os.environ.update(env)
    import torch
    import torch.distributed as dist

    torch.set_num_threads(threads)

    def report(status: tuple) -> None:
        sys.stdout.flush()
        try:
            payload = pickle.dumps(status)
        except Exception as exc:
            payload = pickle.dumps(("error", f"the return value of rank {rank} cannot be pickled: {exc}", "", "run"))
        conn.send_bytes(payload)
        conn.close()

    stage = "init"
    try:
        if init_pg:
            from ddp_tutorial.env import choose_backend, set_device_for

            chosen = backend or choose_backend(local_world_size=world_size)
            set_device_for(rank, chosen)
            dist.init_process_group(chosen, rank=rank, world_size=world_size,
                                    timeout=timedelta(seconds=timeout))
        stage = "run"
        result = fn(rank, world_size, *args)
    except BaseException as exc:  # report everything, even SystemExit, to the parent
        # Report before tearing down: the teardown makes the other ranks fail too,
        # and the parent should hear about the cause first.
        report(("error", f"{type(exc).__name__}: {exc}", traceback.format_exc(), stage))
    else:
        report(("ok", result))
    finally:
        if init_pg and dist.is_initialized():
            gc.collect()  # free DDP/gloo objects in cycles while the group lives (see env.distributed)
            dist.destroy_process_group()
