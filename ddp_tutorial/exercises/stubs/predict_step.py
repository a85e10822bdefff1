"""Exercise 23.3 (medium), lesson 23_how_fast.ipynb: predict a DDP step's FLOPs, bytes and seconds, then run it.

Write predict_step() below (its docstring is the contract: what must hold), then check it:
    check("predict_step")                                 in the notebook
    python -m ddp_tutorial.exercises check predict_step   from a shell
The checker's ranks read this file afresh each time: an edit counts at once.
Hints, one at a time: python -m ddp_tutorial.exercises show predict_step [--hint 2 .. 3]
Start again from the stub: python -m ddp_tutorial.exercises reset predict_step
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
    # Your code here; the checker calls predict_step(sizes, batch, world_size, matmul_flops, link_bytes_per_s, latency_s) on every rank.
    raise NotImplementedError(
        'exercise 23.3 (predict_step): not started yet, as expected for a fresh stub: '
        'my_exercises/predict_step.py still raises NotImplementedError. Next: write predict_step() '
        'there (its docstring is the contract, lesson 23_how_fast.ipynb explains it, '
        "show('predict_step') gives hints), then check again")
