"""ddp-tutorial: the worker code of a hands-on course in distributed PyTorch.

Each lesson notebook in ``notebooks/`` imports its workers from a module here, because
processes started by ``spawn`` must import the function they run. The folders are the
course's parts, in order; each part's ``__init__`` lists its modules with their commands:

- ``comm`` (00, 02-06): process groups, point-to-point, collectives, ring all-reduce
- ``data_parallel`` (01, 07, 08): ``nn.DataParallel`` taken apart, DDP, DDP from scratch
- ``training`` (11): end-to-end training, data, evaluation, checkpoints, reproducibility
- ``cluster`` (09, 16): torchrun, several nodes, elastic restarts, Slurm
- ``pipeline_parallel`` (10): model parallelism, micro-batches, a pipeline x data grid
- ``sharding`` (14): memory per rank, ZeRO from scratch, FSDP2
- ``tensor_parallel`` (15): Megatron by hand, DeviceMesh and DTensor
- ``pitfalls`` (12), ``bench`` (13), ``exercises``, ``plots``: on top of the parts

Shared by all: ``env`` (rank, local rank, world size, backend, device), ``launch`` (the one
way processes start), ``models``, ``timing``, ``nbtools``, ``doctor``
(``python -m ddp_tutorial``: can this machine run the course?) and ``gpu_check``
(``python -m ddp_tutorial.gpu_check``, ``make gpu-check``: does the whole course run on its GPUs?).
"""

__version__ = "0.1.0"
