"""``python -m ddp_tutorial.bench SUBCOMMAND``: benchmarks that print ratios measured in one run.

One module per subcommand (``launch``, ...), each exposing:

- ``HELP``: a one-line description,
- ``add_arguments(parser)``: its own options (optional),
- ``run(args) -> Result``: measure, and return a table plus headline ratios,
- ``plot(result, ax)``: draw it with matplotlib (optional, used by ``--plot``).

``__main__`` adds ``--json`` and ``--plot PATH`` to every subcommand. Notebook
``13_performance`` draws its figures from saved ``--json`` runs.
"""

import importlib
from types import ModuleType

from ddp_tutorial.bench.common import Result, format_table, timed

__all__ = ["Result", "format_table", "timed", "MODULES", "SUBCOMMANDS", "subcommand"]

# Subcommand -> module in this package, in the order ``all`` runs them. Each lesson's benchmark
# lives in its own module, named for what it measures (not after the part it measures).
MODULES = {"launch": "launch", "allreduce": "allreduce", "ddp": "ddp", "ddp-options": "ddp_options",
           "pipeline": "microbatch",
           "collectives": "collective_bw", "dp": "dp", "train": "scaling", "sharding": "footprint",
           "memory": "activation_memory", "context": "context",
           "experts": "dispatch_cost", "published": "published_runs", "roofline": "roofline_bench",
           "stepmodel": "stepmodel_bench"}
SUBCOMMANDS = list(MODULES)


def subcommand(name: str) -> ModuleType:
    """The module of ``python -m ddp_tutorial.bench NAME``; its ``plot()`` draws a saved result."""
    if name not in MODULES:
        raise ValueError(f"no benchmark {name!r}; the subcommands are: {', '.join(SUBCOMMANDS)}")
    return importlib.import_module(f"{__name__}.{MODULES[name]}")
