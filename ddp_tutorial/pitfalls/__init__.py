"""The debugging lab of ``12_debugging_and_pitfalls``: classic mistakes, each reproduced for real.

Every demo is a worker with one mistake and a switch that applies the fix, bounded
by a timeout, so a hang becomes a line of output instead of a frozen kernel.

- ``harness``: ``outcome(worker, world_size, args, timeout=...)`` runs a demo and
  describes what happened (``Outcome``); ``clean_message`` keeps torch's text stable;
- ``collectives``: a collective only some ranks call, a stuck rank, a wrong world
  size, uneven inputs (and ``Join``);
- ``checkpoints``: every rank writing one file, loading without ``map_location``;
- ``launchers``: a port already in use, ``--local_rank`` versus ``LOCAL_RANK`` (also
  a script: ``torchrun --nproc-per-node=2 -m ddp_tutorial.pitfalls.launchers``);
- ``strays``: processes that outlive their job, found and ended by id;
- ``hangs``: which backend each demo runs on and what NCCL does instead
  (``expect``), and ``HANG_CHECKLIST``;
- ``__main__``: ``python -m ddp_tutorial.pitfalls [checklist | NAME ...]``.

Only the harness is imported here: importing a family module from this file would
make ``python -m ddp_tutorial.pitfalls.launchers`` find it imported twice (runpy
warns about that), and every demo would be loaded to use one.
"""

from ddp_tutorial.pitfalls.outcomes import Outcome, clean_message, outcome

__all__ = ["Outcome", "outcome", "clean_message"]
