"""``python -m ddp_tutorial.pitfalls``: the demos of ``12_debugging_and_pitfalls`` from a shell.

    python -m ddp_tutorial.pitfalls                      # every demo, symptom then fix
    python -m ddp_tutorial.pitfalls joins uneven_inputs  # some of them, by name
    python -m ddp_tutorial.pitfalls checklist            # the checklist for hangs

Each demo runs on 2 ranks; on a machine whose ranks would use NCCL, a demo that ran
on gloo also says what NCCL does instead (``hangs.expect``).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Callable, Sequence
from typing import Any

from ddp_tutorial.data_parallel.ddp_spawn import sampler_orders
from ddp_tutorial.env import choose_backend
from ddp_tutorial.pitfalls import checkpoints, launchers, mismatches, strays
from ddp_tutorial.pitfalls.hangs import HANG_CHECKLIST, expect
from ddp_tutorial.pitfalls.outcomes import outcome


def _show(title: str, fn: Callable[..., Any], args: Sequence[Any] = (), demo: str | None = None) -> None:
    """One demo on 2 ranks in one line; ``demo`` names its entry in ``hangs.expect``."""
    print(f"{title}: {outcome(fn, 2, args, timeout=60.0)}", flush=True)
    if demo is not None and choose_backend(local_world_size=2) == "nccl":
        print(f"  on nccl: {expect(demo, 'nccl').on_nccl}")


def _extra_collective() -> None:
    _show("extra collective", mismatches.extra_collective, (), "extra_collective")
    _show("extra collective, DETAIL", mismatches.extra_collective, ("DETAIL",), "extra_collective_detail")


def _skips_barrier() -> None:
    _show("rank stuck, monitored_barrier", mismatches.skips_barrier, (1,), "skips_barrier")


def _joins() -> None:
    _show("wrong world size", mismatches.joins, (3,), "joins")
    _show("world size from WORLD_SIZE", mismatches.joins, (None, 30.0), "joins")


def _uneven_inputs() -> None:
    _show("uneven inputs", mismatches.uneven_inputs, (False,), "uneven_inputs")
    _show("uneven inputs with Join", mismatches.uneven_inputs, (True,), "uneven_inputs")


def _set_epoch() -> None:
    for flag in (False, True):
        orders = [sampler_orders(r, 2, 8, 3, set_epoch=flag) for r in range(2)]
        print(f"set_epoch={flag}: rank 0 sees {orders[0]}")


def _checkpoints() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "checkpoint.pt")
        _show("every rank saves", checkpoints.every_rank_saves, (path,))
        _show("rank 0 saves atomically", checkpoints.rank0_saves_atomically, (path,))
        _show("load without map_location", checkpoints.load_gpu_checkpoint, (path, False))
        _show("load with map_location", checkpoints.load_gpu_checkpoint, (path, True))


def _ports() -> None:
    print(f"port already in use: {launchers.store_on_busy_port()}")
    print(f"port 0 instead: free port found = {launchers.store_on_port_zero()}")


def _local_rank() -> None:
    found = outcome(launchers.local_rank_as_launched, 2, ([],), timeout=60.0)
    print(*found.log_lines("gives"), sep="\n")


def _strays() -> None:
    job = strays.crash_a_job()
    print(f"launcher killed; its ranks still alive: {[strays.alive(p) for p in job.rank_pids]}, "
          f"their ports still taken: {[strays.port_in_use(p) for p in job.ports]}")
    found = strays.processes_in_session(job.session)
    print(f"found by session id: {len(found)} processes, the ranks: {found == job.rank_pids}")
    print(f"left after end_processes: {strays.end_processes(found)}; "
          f"ports free again: {[not strays.port_in_use(p) for p in job.ports]}")
    for line in strays.main_module_target():
        print(line)


# The demos in the order a plain run shows them: (name on the command line, what prints it).
DEMOS: list[tuple[str, Callable[[], None]]] = [
    ("extra_collective", _extra_collective),
    ("skips_barrier", _skips_barrier),
    ("joins", _joins),
    ("uneven_inputs", _uneven_inputs),
    ("set_epoch", _set_epoch),
    ("checkpoints", _checkpoints),
    ("ports", _ports),
    ("local_rank", _local_rank),
    ("strays", _strays),
]


def main(argv: list[str] | None = None) -> int:
    """Run the named demos (all by default), or print the checklist for hangs."""
    chosen = dict(DEMOS)
    parser = argparse.ArgumentParser(prog="python -m ddp_tutorial.pitfalls", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=f"demos: {', '.join(chosen)}")
    parser.add_argument("names", nargs="*", metavar="checklist | NAME",
                        help="'checklist', or the demos to run (default: every demo)")
    names = parser.parse_args(argv).names
    unknown = [name for name in names if name != "checklist" and name not in chosen]
    if unknown:
        parser.error(f"unknown demo {', '.join(unknown)}; choose 'checklist' or from: {', '.join(chosen)}")
    for name in names or list(chosen):
        if name == "checklist":
            print(HANG_CHECKLIST, end="")
        else:
            chosen[name]()
    return 0


if __name__ == "__main__":
    sys.exit(main())
