"""Part 6, sharding (lessons 13, 16): every rank keeps 1/N of the training state; where its bytes go.

The modules, in lesson order:
- ``memory`` (13): bytes per rank, the ZeRO paper's formulas against what a rank really holds
- ``zero`` (13): ZeRO-1 (optimizer state) and ZeRO-2 (gradients) from scratch;
  ``torchrun --nproc-per-node=2 -m ddp_tutorial.sharding.zero``
- ``fsdp`` (13): FSDP2's ``fully_shard``, parameters sharded too;
  ``torchrun --nproc-per-node=2 -m ddp_tutorial.sharding.fsdp``
- ``activations`` (16): the bytes autograd saves for backward, by layer and op, against the formula
- ``precision`` (16): bf16 and fp16 limits, loss scaling, fp32 master weights (2 + 2 + 12 bytes)
- ``recompute`` (16): full and selective activation checkpointing, their bytes and FLOPs
- ``calculator`` (16): bytes per rank per term for a model shape and dp/tp/pp/cp/ZeRO/recompute;
  ``python -m ddp_tutorial.sharding.calculator --model llama-8b --dp 8 --zero 1``
"""
