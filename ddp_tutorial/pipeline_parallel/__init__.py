"""Part 5, pipeline parallelism (lessons 10, 19): the model split into stages, micro-batches in flight, schedules.

The modules, in lesson order:
- ``model_parallel`` (10): a model split over devices inside one process, wrapped by DDP;
  ``torchrun --nproc-per-node=2 -m ddp_tutorial.pipeline_parallel.model_parallel``
- ``pipeline`` (10): micro-batches through a split model, and its measured idle time (the bubble)
- ``pipeline_grid`` (10): pipeline stages across processes times data-parallel replicas;
  ``torchrun --nproc-per-node=4 -m ddp_tutorial.pipeline_parallel.pipeline_grid``
- ``orders`` (19): schedules as orders of F and B per stage, simulated on an ideal clock (bubble,
  activations held, deadlocks named)
- ``one_f_one_b`` (19): 1F1B (and GPipe) from scratch with ``isend``/``irecv``, each action timed;
  ``torchrun --nproc-per-node=2 -m ddp_tutorial.pipeline_parallel.one_f_one_b``,
  ``torchrun --nproc-per-node=4 -m ddp_tutorial.pipeline_parallel.one_f_one_b --schedule gpipe``
- ``torch_schedules`` (19): torch's GPipe, 1F1B, interleaved 1F1B and zero-bubble schedules on
  ``PipelineStage`` objects, timed per action; ``torchrun --nproc-per-node=2 -m ddp_tutorial.pipeline_parallel.torch_schedules``,
  ``torchrun --nproc-per-node=4 -m ddp_tutorial.pipeline_parallel.torch_schedules --num-micro 8``
"""
