"""Run a worker on several processes from a notebook, a test or a shell.

``spawn(fn, world_size)`` is what every notebook uses (from ``00_start_here`` on):

    >>> from ddp_tutorial.launch import spawn
    >>> from ddp_tutorial.comm.hello import all_reduce_ranks
    >>> spawn(all_reduce_ranks, world_size=2)
    [1.0, 1.0]

Why not ``torch.multiprocessing.spawn``? Three reasons a notebook feels:
- What child processes print reaches a notebook mixed up, in whichever cell is
  running when it arrives (and not at all on Windows or under nbval); here every
  rank's output is captured, shown while the ranks run, and re-printed by the
  parent as ``[rank N] ...``, in rank order, when they are done.
- Each ``mp.spawn`` child imports torch from scratch (seconds). Here children are
  forked from a *forkserver* that imported torch once, so a warm launch costs tens
  of milliseconds (``python -m ddp_tutorial.bench launch`` measures it).
- A failing or hanging rank must not freeze the kernel: it becomes a
  ``WorkerError`` / ``WorkerTimeout`` and every child is stopped. So does Ctrl-C
  (Jupyter's stop button): ``LaunchInterrupted``, a ``KeyboardInterrupt`` whose
  one line says the ranks stopped, with none of the launcher's frames.
- ``warm_up()`` starts the forkserver ahead of time (notebooks do, before anything
  is timed); until the first ranks print, a person watching sees "starting 2 ranks...".

The rendezvous store is hosted by the parent on a port the kernel picks
(127.0.0.1 by default), so two launches never race for a port. Children join it
as clients, exactly the way torchrun's workers join the agent's store.

``torchrun(module, nproc_per_node)`` runs the real ``torchrun`` in a subprocess
and returns its exit code and output (used from ``09_torchrun`` on).

The modules, parent to child:
- ``spawner``: ``spawn``, the parent's side; ``spec``: ``LaunchSpec``, one launch's settings;
- ``child``: what runs in each rank; ``errors``: ``WorkerError``, ``WorkerTimeout``, ``LaunchInterrupted``;
- ``output``: reading the ranks' output; ``live``: showing it while they run;
- ``commands``: ``torchrun`` and any launcher command, with a timeout and no orphans;
- ``procs``: the process tree, stopping a process group, Ctrl-C held back meanwhile;
- ``stopping``: the end of a launch, every rank and everything it started stopped, sessions included.
"""

from ddp_tutorial.launch.commands import TorchrunError, TorchrunResult, run_command, torchrun, torchrun_command
from ddp_tutorial.launch.errors import LaunchInterrupted, WorkerError, WorkerTimeout
from ddp_tutorial.launch.spawner import spawn, warm_up
from ddp_tutorial.launch.spec import LOCALHOST, PLAIN_TEXT, LaunchSpec, free_port, watched_live

__all__ = ["spawn", "warm_up", "torchrun", "torchrun_command", "run_command", "free_port", "watched_live",
           "LaunchSpec", "WorkerError", "WorkerTimeout", "LaunchInterrupted", "TorchrunError", "TorchrunResult",
           "LOCALHOST", "PLAIN_TEXT"]
