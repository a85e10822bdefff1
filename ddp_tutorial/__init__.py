"""ddp-tutorial: the worker code of a hands-on course in distributed PyTorch.

Each lesson notebook in ``notebooks/`` imports its workers from one module here,
because processes started by ``spawn`` must import the function they run.
Shared infrastructure: ``launch`` (spawn/torchrun from a notebook) and ``env``
(backend, device and rank information).
"""

__version__ = "0.1.0"
