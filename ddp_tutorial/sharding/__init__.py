"""Part 6, sharding (lessons 14, 17, 18): every rank keeps 1/N of the training state; where its bytes go.

The modules, in lesson order:
- ``memory`` (14): bytes per rank, the ZeRO paper's formulas against what a rank really holds
- ``zero`` (14): ZeRO-1 (optimizer state) and ZeRO-2 (gradients) from scratch;
  ``torchrun --nproc-per-node=2 -m ddp_tutorial.sharding.zero``
- ``fsdp`` (14): FSDP2's ``fully_shard``, parameters sharded too;
  ``torchrun --nproc-per-node=2 -m ddp_tutorial.sharding.fsdp``
- ``activations`` (17): the bytes autograd saves for backward, by layer and op, against the formula
- ``precision`` (17): bf16 and fp16 limits, loss scaling, fp32 master weights (2 + 2 + 12 bytes)
- ``recompute`` (17): full and selective activation checkpointing, their bytes and FLOPs
- ``calculator`` (17): bytes per rank per term for a model shape and dp/tp/pp/cp/ZeRO/recompute;
  ``python -m ddp_tutorial.sharding.calculator --model llama-8b --dp 8 --zero 1``
- ``zero3`` (18): ZeRO-3 from scratch, the parameters sharded and gathered one unit at a time
- ``zero3_train`` (18): ``zero3`` trained against one process (float32 bitwise, bfloat16 within a tolerance);
  ``torchrun --nproc-per-node=2 -m ddp_tutorial.sharding.zero3_train``
- ``fsdp_practice`` (18): FSDP2 as used in practice: meta-device init, ``MixedPrecisionPolicy``, accumulation
  and its gradient bytes; ``torchrun --nproc-per-node=2 -m ddp_tutorial.sharding.fsdp_practice``
- ``fsdp_prefetch`` (18): FSDP2's prefetch and ``reshard_after_forward`` settings, their all-gathers counted;
  ``torchrun --nproc-per-node=4 -m ddp_tutorial.sharding.fsdp_prefetch``
- ``sharded_checkpoint`` (18): DCP checkpoints saved on N ranks, loaded on M;
  ``torchrun --nproc-per-node=4 -m ddp_tutorial.sharding.sharded_checkpoint``
- ``sharded_resume`` (18): a ``Stateful`` training state (per-rank RNG and data position), ``dcp.async_save``,
  crash and resume to identical weights;
  ``torchrun --nproc-per-node=2 --max-restarts=1 -m ddp_tutorial.sharding.sharded_resume --checkpoint-dir ckpt --fail-at-step 3``
"""
