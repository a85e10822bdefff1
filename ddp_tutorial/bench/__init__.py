"""``python -m ddp_tutorial.bench SUBCOMMAND``: benchmarks that print ratios measured in one run.

One module per subcommand (``launch``, ...), each exposing:

- ``HELP``: a one-line description,
- ``add_arguments(parser)``: its own options (optional),
- ``run(args) -> Result``: measure, and return a table plus headline ratios,
- ``plot(result, ax)``: draw it with matplotlib (optional, used by ``--plot``).

``__main__`` adds ``--json`` and ``--plot PATH`` to every subcommand. Notebook
``12_performance`` draws its figures from saved ``--json`` runs.
"""

from ddp_tutorial.bench.common import Result, format_table, timed

__all__ = ["Result", "format_table", "timed"]
