"""Part 8, context parallelism (lesson 20): attention over a sequence split across ranks.

The modules, in lesson order:
- ``online_softmax`` (20): attention in blocks of keys and the log-sum-exp merge (stable, float32
  accumulation, grouped-query attention);
- ``ring_attention`` (20): ring attention from scratch, K/V blocks passed around the ring,
  forward and backward;
  ``torchrun --nproc-per-node=4 -m ddp_tutorial.context_parallel.ring_attention``
- ``zigzag`` (20): the causal load balance, rank ``r`` holding chunks ``r`` and ``2N - 1 - r``,
  measured by the critical path;
  ``torchrun --nproc-per-node=4 -m ddp_tutorial.context_parallel.zigzag``
- ``ulysses`` (20): the all-to-all alternative, heads scattered and the sequence gathered;
  ``torchrun --nproc-per-node=2 -m ddp_tutorial.context_parallel.ulysses``
- ``comm_volume`` (20): the bytes ring and Ulysses send, counted and held against the formulas;
- ``torch_cp`` (20): torch's own ``context_parallel``, its defaults read from torch (CUDA only);
  ``torchrun --nproc-per-node=2 -m ddp_tutorial.context_parallel.torch_cp``
"""
