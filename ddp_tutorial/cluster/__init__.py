"""Part 4, to the cluster (lessons 09, 16): torchrun, several nodes, elastic restarts, Slurm.

The modules, in lesson order:
- ``multinode`` (09): what a launcher tells each process, two "nodes" on one machine, restarts;
  ``torchrun --nproc-per-node=2 -m ddp_tutorial.cluster.multinode``
- ``elastic`` (16): training under ``@record``, a node joining and leaving;
  ``torchrun --nproc-per-node=2 -m ddp_tutorial.cluster.elastic --epochs 2``
- ``jobs`` (16): the course's Slurm job scripts (``*.sbatch`` beside it), and one ``srun`` task per rank;
  ``python -m ddp_tutorial.cluster.jobs list``, ``python -m ddp_tutorial.cluster.jobs show multi_node.sbatch``

It runs ``training``'s program; ``training`` never imports this part.
"""
