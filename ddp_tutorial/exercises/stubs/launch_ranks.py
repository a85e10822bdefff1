"""Exercise 3.1 (medium), lesson 03_start_methods.ipynb: start ranks with multiprocessing alone.

Write launch_ranks() below (its docstring is the contract: what must hold), then check it:
    check("launch_ranks")                                 in the notebook
    python -m ddp_tutorial.exercises check launch_ranks   from a shell
The checker's ranks read this file afresh each time: an edit counts at once.
Hints, one at a time: python -m ddp_tutorial.exercises show launch_ranks [--hint 2 .. 3]
Start again from the stub: python -m ddp_tutorial.exercises reset launch_ranks
"""

from __future__ import annotations

import multiprocessing
import queue
import time
import traceback
from collections.abc import Callable
from typing import Any


def launch_ranks(fn: Callable[..., Any], world_size: int, args: tuple = (), timeout: float = 60.0) -> list:
    """Run ``fn(rank, world_size, *args)`` in ``world_size`` new processes; return the results by rank.

    Use ``multiprocessing`` only (not ``torch.multiprocessing`` nor ``ddp_tutorial.launch``),
    with a start method that is safe with threads and CUDA: ``"spawn"`` or ``"forkserver"``,
    never ``"fork"`` (nor the default, which is fork on Linux up to Python 3.13). ``fn`` is a
    module-level function, so a child can import it; anything else a child runs must be
    module-level in this file too. All ranks run at once. The list returned has one result
    per rank, in rank order (``result[r]`` is rank r's), whatever order the ranks finish in.
    A rank that raises, or whose process exits with a non-zero code, makes ``launch_ranks``
    raise an exception whose message names the rank ("rank 1 ..."). When ``timeout`` seconds
    pass before every rank has returned, raise ``TimeoutError``. Whatever happens, no child
    is left running when ``launch_ranks`` returns or raises: stop the ones still running
    (``terminate()`` or ``kill()``) and ``join()`` every child.
    """
    # Your code here; the checker calls launch_ranks(fn, world_size, args, timeout) on every rank.
    raise NotImplementedError(
        'exercise 3.1 (launch_ranks): not started yet, as expected for a fresh stub: '
        'my_exercises/launch_ranks.py still raises NotImplementedError. Next: write launch_ranks() '
        'there (its docstring is the contract, lesson 03_start_methods.ipynb explains it, '
        "show('launch_ranks') gives hints), then check again")
