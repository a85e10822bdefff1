"""Exercise 23.3, reference solution: one rank's FLOPs, bytes and seconds of a DDP step, predicted.

A linear layer ``nn.Linear(i, o)`` on ``r`` rows does ``2 r i o`` FLOPs forward (a multiply and
an add per weight per row). Its backward does the same product twice more: once for the
weight's gradient, once for its input's. The model's first layer is the exception: its input is
the data, which needs no gradient, so its backward does only the weight's. Under DDP each rank
runs its own ``batch / world_size`` rows. Every gradient (weights and biases, float32) is then
all-reduced: a ring sends ``2 (n - 1) / n`` of the buffer from each rank, in ``2 (n - 1)`` steps
that each pay the latency once. Nothing overlaps here: the step is the compute, then the
all-reduce.
"""

from __future__ import annotations


def predict_step(sizes: list[tuple[int, int]], batch: int, world_size: int, *, matmul_flops: float,
                 link_bytes_per_s: float, latency_s: float) -> dict[str, float]:
    """Predict one rank's forward and backward step of an MLP under DDP, before it runs.

    The model is ``nn.Linear(i, o)`` for each ``(i, o)`` in ``sizes`` (each with its bias, float32,
    a ReLU between them), every parameter trained. ``batch`` rows in all are split evenly over
    ``world_size`` ranks (DDP); the input rows are data, they need no gradient. Return a dict:

    - ``"flops"``: the FLOPs this rank's forward and backward do in the linears' matrix products
      (what ``torch.utils.flop_counter.FlopCounterMode`` counts: ReLU and the loss count nothing);
    - ``"bytes"``: the bytes this rank sends in DDP's all-reduce of the gradients, as a ring
      all-reduce (reduce-scatter, then all-gather) over ``world_size`` ranks sends them;
    - ``"seconds"``: the step's time with NO overlap: the compute at ``matmul_flops`` FLOP/s, plus
      the all-reduce, ``latency_s`` once per ring step plus ``"bytes"`` at ``link_bytes_per_s``
      bytes per second.

    The checker runs this step on gloo ranks, counts the FLOPs and the gradient bytes handed to
    the all-reduce, and compares. Pure arithmetic: no collective is called.
    """
    rows = batch // world_size
    flops = 0
    for k, (d_in, d_out) in enumerate(sizes):
        forward = 2 * rows * d_in * d_out
        flops += forward * (3 if k > 0 else 2)  # forward, the weight's gradient, the input's (not the data's)
    gradient_bytes = 4 * sum(d_in * d_out + d_out for d_in, d_out in sizes)
    sent = 2 * (world_size - 1) / world_size * gradient_bytes
    all_reduce = 2 * (world_size - 1) * latency_s + sent / link_bytes_per_s
    return {"flops": flops, "bytes": sent, "seconds": flops / matmul_flops + all_reduce}
