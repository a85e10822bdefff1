"""Part 9, expert parallelism (lesson 21): a mixture-of-experts layer with its experts split over ranks.

The modules, in lesson order:
- ``routing`` (21): top-k gates, capacity and dropped tokens, the load-balancing loss, in one process;
  ``python -m ddp_tutorial.expert_parallel.routing``
- ``dispatch`` (21): the experts over ranks, tokens dispatched and combined with ``all_to_all_single``;
  ``torchrun --nproc-per-node=4 -m ddp_tutorial.expert_parallel.dispatch``
- ``ep_dp`` (21): expert parallelism for the experts, data parallelism for every other layer;
  ``torchrun --nproc-per-node=4 -m ddp_tutorial.expert_parallel.ep_dp``
"""
