"""How fast, and why (issue 39; its lesson follows the capstone): FLOPs, the roofline, a step-time model.

- ``flops``: a decoder's FLOPs from its shape (``TransformerShape``): ``6 N D`` and the attention
  term, model FLOPs (MFU) against the hardware's (HFU: recomputation, flash attention's backward),
  and ``mfu`` over every device of the job. Checked against ``torch.utils.flop_counter``;
- ``roofline``: this machine's achievable matmul rate and memory bandwidth, the ridge point, and the
  arithmetic intensity of a linear layer and a norm placed between them;
- ``hardware``: published A100, H100, H200 and B200 figures (dense bf16 peak, achievable matmul rate,
  HBM, NVLink and network bandwidth), each with its source;
- ``stepmodel``: one training step of a layout (DP, ZeRO 0-3, TP with or without SP, CP by ring or Ulysses,
  PP, EP) turned into seconds: compute, each group's alpha-beta communication, what overlaps, the bubble; MFU;
- ``steplayout``: the step model's ``StepLayout`` and its collectives' ring volumes and alpha-beta costs;
- ``stepcomm``: each process group's communication seconds in a step (TP, CP ring or Ulysses, PP, DP/ZeRO, EP);
- ``kernels``: the memory-bound kernels (norms, softmax, activations, residual adds, dropout) timed at HBM
  bandwidth from the bytes each reads and writes, ``stepmodel.predict(..., memory_bound=...)``;
- ``timing_plan``: the capstone's planner ranking the layouts that fit by predicted step time under a global
  batch; Llama 3 405B on 16,384 H100s beside Meta's layout; ``python -m ddp_tutorial.performance.timing_plan``;
- ``published``: Llama 3 405B (Table 4) and Megatron-LM (Table 1) runs, their layouts and reported
  TFLOPs, held against ``stepmodel`` by ``python -m ddp_tutorial.bench published``.
- ``this_machine``: this CPU and gloo as a ``Hardware`` (achievable matmul rate, copy bandwidth, gloo's fitted
  alpha-beta), and the FLOPs and bytes of a ``DeepMLP`` step under DDP, FSDP2, TP and a 2-stage pipeline,
  predicted with ``stepmodel``'s rules and measured by ``python -m ddp_tutorial.bench stepmodel``.
"""
