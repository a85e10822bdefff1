"""Part 7, tensor parallelism (lesson 14): every weight matrix split over ranks.

The modules, in lesson order:
- ``split_mlp`` (14): an MLP split Megatron-style by hand (column- then row-parallel);
  ``torchrun --nproc-per-node=4 -m ddp_tutorial.tensor_parallel.split_mlp``
- ``device_mesh`` (14): ``DeviceMesh``, ``DTensor``, ``parallelize_module``, then a 2-D mesh;
  ``torchrun --nproc-per-node=4 -m ddp_tutorial.tensor_parallel.device_mesh``
"""
