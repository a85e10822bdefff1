"""Part 7, tensor parallelism (lessons 15, 20): every weight matrix split over ranks.

The modules, in lesson order:
- ``split_mlp`` (15): an MLP split Megatron-style by hand (column- then row-parallel);
  ``torchrun --nproc-per-node=4 -m ddp_tutorial.tensor_parallel.split_mlp``
- ``device_mesh`` (15): ``DeviceMesh``, ``DTensor``, ``parallelize_module``, then a 2-D mesh;
  ``torchrun --nproc-per-node=4 -m ddp_tutorial.tensor_parallel.device_mesh``
- ``sequence_parallel`` (20): a Llama block split by heads, then sequence parallelism by hand
  (all-gather / reduce-scatter), activation bytes per rank;
  ``torchrun --nproc-per-node=2 -m ddp_tutorial.tensor_parallel.sequence_parallel``
- ``vocab_parallel`` (20): a vocabulary-parallel embedding and cross-entropy by hand;
  ``torchrun --nproc-per-node=2 -m ddp_tutorial.tensor_parallel.vocab_parallel``
- ``llama_plan`` (20): the Llama plan with ``parallelize_module`` (``SequenceParallel``,
  ``PrepareModuleInput``) and ``loss_parallel``;
  ``torchrun --nproc-per-node=2 -m ddp_tutorial.tensor_parallel.llama_plan``
"""
