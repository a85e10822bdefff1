"""Part 5, pipeline parallelism (lesson 09): the model split into stages, micro-batches in flight.

The modules, in lesson order:
- ``model_parallel`` (09): a model split over devices inside one process, wrapped by DDP;
  ``torchrun --nproc-per-node=2 -m ddp_tutorial.pipeline_parallel.model_parallel``
- ``pipeline`` (09): micro-batches through a split model, and its measured idle time (the bubble)
- ``pipeline_grid`` (09): pipeline stages across processes times data-parallel replicas;
  ``torchrun --nproc-per-node=4 -m ddp_tutorial.pipeline_parallel.pipeline_grid``
"""
