"""Part 2, data parallelism (lessons 01, 07, 08): a replica per device, gradients averaged.

The modules, in lesson order:
- ``mini_dp`` (01): ``nn.DataParallel`` taken apart (scatter, replicate, parallel_apply, gather);
  ``python -m ddp_tutorial.bench dp`` measures it against DDP
- ``ddp_spawn`` (07): DDP with one process per device, started by spawn;
  ``torchrun --nproc-per-node=2 -m ddp_tutorial.data_parallel.ddp_spawn`` or
  ``python -m ddp_tutorial.data_parallel.ddp_spawn`` (``mp.spawn``)
- ``samplers`` (07): how ``DistributedSampler`` shares a dataset out, and what that does to a metric
- ``unused_parameters`` (07): a parameter without a gradient, and DDP's reduction error
- ``ddp_from_scratch`` (08): ``NaiveDDP``, ``FlatDDP``, ``BucketedDDP``, each equal to torch's DDP;
  ``torchrun --nproc-per-node=2 -m ddp_tutorial.data_parallel.ddp_from_scratch``
- ``buckets`` (08): how big a bucket should be, per-call latency against a late start
- ``overlap`` (08): what overlapping communication with backward hides, rung by rung
- ``link`` (08): a simulated wire of known bandwidth beside gloo, where overlap pays off
"""
