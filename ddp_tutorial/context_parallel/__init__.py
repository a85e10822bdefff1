"""Part 8, context parallelism (lesson 20): attention over a sequence split across ranks.

The modules, in lesson order:
- ``ring_attention`` (20): ring attention from scratch, K/V blocks passed around the ring, the
  log-sum-exp merge, forward and backward;
  ``torchrun --nproc-per-node=4 -m ddp_tutorial.context_parallel.ring_attention``
- ``zigzag`` (20): the causal load balance, rank ``r`` holding chunks ``r`` and ``2N - 1 - r``;
  ``torchrun --nproc-per-node=4 -m ddp_tutorial.context_parallel.zigzag``
- ``ulysses`` (20): the all-to-all alternative, heads scattered and the sequence gathered;
  ``torchrun --nproc-per-node=2 -m ddp_tutorial.context_parallel.ulysses``
"""
