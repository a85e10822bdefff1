"""Part 6, sharding (lesson 13): every rank keeps 1/N of the training state.

The modules, in lesson order:
- ``memory`` (13): bytes per rank, the ZeRO paper's formulas against what a rank really holds
- ``zero`` (13): ZeRO-1 (optimizer state) and ZeRO-2 (gradients) from scratch;
  ``torchrun --nproc-per-node=2 -m ddp_tutorial.sharding.zero``
- ``fsdp`` (13): FSDP2's ``fully_shard``, parameters sharded too;
  ``torchrun --nproc-per-node=2 -m ddp_tutorial.sharding.fsdp``
"""
