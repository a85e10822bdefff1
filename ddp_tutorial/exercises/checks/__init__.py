"""The checks, one module per lesson, named after its notebook (``lesson_ring_all_reduce`` checks
``06_ring_all_reduce``): each defines its ``EXERCISES`` and their rank-side workers; ``registry``
finds them all and orders them by number. A lesson's module may import an exercise's worker
from a helper module beside it (``checkpoint_loading`` for 18.2; ``causal_ring`` for 20.2, with
what it shares with 20.1 in ``attention_checks``; ``mesh_gradients`` for 15.2; ``launching`` for 3.1,
whose children run the standard-library workers of ``launch_targets``; ``estimates`` for 23.1 and 23.2,
``counted_step`` for 23.3, ``tp_bound`` for 23.6 and 23.7), to stay one screenful per topic. Lesson 23's seven
exercises live in three modules, ``lesson_how_fast`` (23.1, 23.2), ``lesson_how_fast_scale`` (23.3, 23.4) and
``lesson_how_fast_limits`` (23.5-23.7, problems at GPU scale with exact answers).

A worker runs in every rank as ``worker(rank, world_size, source, function, trace_dir)``,
loads the learner's function from ``source`` (``harness.load_function``) and compares
what it does with a reference computed another way: torch's own collectives
(``tracing.original``) or the same computation in one process.
"""
