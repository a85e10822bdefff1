"""How fast, and why (issue 39; its lesson follows the capstone): FLOPs, the roofline, a step-time model.

- ``flops``: a decoder's FLOPs from its shape (``TransformerShape``): ``6 N D`` and the attention
  term, model FLOPs (MFU) against the hardware's (HFU: recomputation, flash attention's backward),
  and ``mfu`` over every device of the job. Checked against ``torch.utils.flop_counter``;
- ``roofline``: this machine's achievable matmul rate and memory bandwidth, the ridge point, and the
  arithmetic intensity of a linear layer and a norm placed between them.
"""
