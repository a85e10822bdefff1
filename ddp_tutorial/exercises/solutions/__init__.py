"""Reference solutions, one module per exercise, named after it.

Each is the single source of its stub (``exercises.stubgen`` keeps the imports, the
signature and the docstring, and replaces the body). The checker never compares a
learner's result with these: it compares with torch's collectives or with a
computation in one process. ``check NAME --solution`` checks them like any file.
"""
