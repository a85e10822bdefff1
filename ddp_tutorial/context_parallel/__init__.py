"""Part 8, context parallelism (lesson 19): attention over a sequence split across ranks.

The modules, in lesson order:
- ``ring_attention`` (19): ring attention from scratch, K/V blocks around the ring, the
  log-sum-exp merge, forward and backward; ``torchrun --nproc-per-node=4 -m ddp_tutorial.context_parallel.ring_attention``
"""
