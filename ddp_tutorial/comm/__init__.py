"""Part 1, communication (lessons 00, 02-06): ranks, process groups and the messages between them.

The modules, in lesson order:
- ``hello`` (00): the first distributed program, an all-reduce of the ranks;
  ``torchrun --nproc-per-node=2 -m ddp_tutorial.comm.hello``
- ``process_groups`` (02): rendezvous, sub-groups, barrier, timeouts, tear-down;
  ``torchrun --nproc-per-node=2 -m ddp_tutorial.comm.process_groups``
- ``start_methods`` (03): how Python starts a child (fork, spawn, forkserver) and the two classic launchers;
  ``python -m ddp_tutorial.comm.start_methods``
- ``p2p`` (04): send/recv, isend/irecv, batch_isend_irecv, a token ring, deadlocks;
  ``torchrun --nproc-per-node=2 -m ddp_tutorial.comm.p2p``
- ``collectives`` (05): every collective, what each rank holds before and after;
  ``torchrun --nproc-per-node=2 -m ddp_tutorial.comm.collectives``
- ``object_collectives`` (05): any picklable object, for small metadata
- ``ring`` (06): ring all-reduce from scratch, equal to ``dist.all_reduce``;
  ``torchrun --nproc-per-node=2 -m ddp_tutorial.comm.ring``
- ``busbw`` (06): bus bandwidth, and measuring an all-reduce against ``dist.all_reduce``

Everything above it (data parallel, training, the parallelisms) is built on these; this part
imports only ``env`` and ``launch``.
"""
