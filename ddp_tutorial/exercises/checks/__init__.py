"""The checks, one module per lesson: each defines its ``EXERCISES`` and their rank-side workers.

A worker runs in every rank as ``worker(rank, world_size, source, function, trace_dir)``,
loads the learner's function from ``source`` (``harness.load_function``) and compares
what it does with a reference computed another way: torch's own collectives
(``tracing.original``) or the same computation in one process.
"""
