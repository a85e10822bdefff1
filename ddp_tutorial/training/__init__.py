"""Part 3, training (lesson 11): a complete DDP training program and what it needs to be trusted.

The modules, in lesson order:
- ``train`` (11): end-to-end DDP training, alone, under torchrun or from a notebook;
  ``torchrun --nproc-per-node=2 -m ddp_tutorial.training.train --epochs 5``,
  ``python -m ddp_tutorial.training.train --epochs 5`` (one process)
- ``data``: the offline datasets (digits, CIFAR-10 from a folder, fake) and each rank's loaders
- ``evaluation``: every rank scores its own shard, one all-reduce adds them up
- ``options``: ``TrainConfig``, every rule on the options, the command line (checked before any work)
- ``checkpoint``: written by rank 0 atomically, read with ``weights_only``, resumed by every rank
- ``checkpoint_file``: a checkpoint's bytes: sealed with a SHA-256, temporary names, the path checked before training
- ``reproducibility``: one seed for every rank, deterministic kernels where they matter
- ``warmup``: a linear learning-rate warm-up for the larger global batch
- ``preemption``: stop on a signal the ranks agree on, after the epoch (USR1, a time limit's warning)
  or after the step with a mid-epoch checkpoint (TERM, a preemption) (used by lessons 09 and 16)

``cluster`` runs this part on several nodes and under Slurm; this part never imports ``cluster``.
"""
