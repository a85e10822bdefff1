"""Part 10, the capstone (lesson 22): one small GPT trained with every parallelism at once, equal to one process.

The modules, in lesson order:
- ``chars`` (22): character-level text from a fixed grammar, and each step's global batch;
  ``python -m ddp_tutorial.capstone.chars``
- ``reference`` (22): ``CharGPT`` trained by one process, the run every layout must equal;
  ``python -m ddp_tutorial.capstone.reference``
- ``layout`` (22): ``--dp --tp --pp --cp`` -> one ``DeviceMesh`` (``pp, dp, cp, tp``), every
  admitted layout, each rank's coordinates and groups;
  ``python -m ddp_tutorial.capstone.layout --dp 2 --tp 2 --pp 2``
- ``parallelize`` (22): pipeline stage, tensor + sequence parallelism, context parallelism (ring
  attention), FSDP2, applied to the model
- ``composed`` (22): the training on a ``pp x dp x cp x tp`` mesh (1F1B over ``pp``) against the reference;
  ``torchrun --nproc-per-node=8 -m ddp_tutorial.capstone.composed --dp 2 --tp 2 --pp 2``
- ``traffic`` (22): which group does what: each mesh dimension's collectives per step, counted,
  and each rank's bytes of parameters, gradients and optimizer state from its real shards;
  ``torchrun --nproc-per-node=8 -m ddp_tutorial.capstone.traffic --dp 2 --tp 2 --pp 2``
- ``rank_memory`` (22): each rank's parameters, gradients, optimizer state and saved activations, measured
  on one composed step, beside ``sharding.calculator``'s prediction and the gap it leaves for ``CharGPT``;
  ``python -m ddp_tutorial.capstone.rank_memory --dp 2 --tp 2``
- ``planning`` (22): choosing a layout: the calculator applied to Llama 3 8B/70B on nodes of 8 GPUs,
  under the Playbook's rules (tp within a node, pp across nodes, dp the rest, cp for long sequences);
  ``python -m ddp_tutorial.capstone.rank_memory --plan llama3-8b --gpus 64``
- ``resume`` (22): saved with DCP under one layout, resumed under another, as if uninterrupted;
  ``torchrun --nproc-per-node=4 -m ddp_tutorial.capstone.resume --save-layout dp=2,tp=2 --load-layout tp=2,pp=2``
"""
