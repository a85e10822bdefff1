"""Mixed precision: what bf16 and fp16 can hold, loss scaling, fp32 master weights, and their bytes.

``17_memory`` shows where each 16-bit format breaks (``breaking_points``), rescues fp16's
gradients with a loss scale (``scaled_gradients``, ``torch.amp.GradScaler``), counts the
ZeRO paper's 2 + 2 + 12 bytes per parameter on real tensors (``MasterWeights``: 16 between
steps, 20 at its peak inside ``step()``; Megatron's fp32 ``main_grad``: 18), and trains one
model on a batch it can learn in float32, under ``torch.autocast(dtype=torch.bfloat16)`` and
with its weights stored in bf16 (``learning_curves``).
"""

from __future__ import annotations

import copy
import functools

import torch
from torch import nn

from ddp_tutorial.models import TinyTransformer, token_batch
from ddp_tutorial.sharding.memory import optimizer_state_bytes, tensor_bytes

__all__ = ["FORMATS", "format_limits", "breaking_points", "scaled_gradients", "MasterWeights", "CURVES",
           "learning_curves"]

FORMATS = (torch.float32, torch.float16, torch.bfloat16)


def format_limits() -> list[dict]:
    """Per format: exponent and mantissa bits, the largest value, the smallest normal, eps (spacing at 1)."""
    bits = {torch.float32: (8, 23), torch.float16: (5, 10), torch.bfloat16: (8, 7)}
    return [{"dtype": str(d).removeprefix("torch."), "exponent bits": bits[d][0], "mantissa bits": bits[d][1],
             "max": torch.finfo(d).max, "smallest normal": torch.finfo(d).tiny, "eps": torch.finfo(d).eps}
            for d in FORMATS]


def breaking_points() -> dict[str, dict[str, float]]:
    """Values where each format breaks, computed in each: overflow, underflow, a lost small addend."""
    cases = {"70000 (an activation past fp16's max)": lambda d: torch.tensor(70000.0, dtype=d),
             "1e-8 (a small gradient)": lambda d: torch.tensor(1e-8, dtype=d),
             "1 + 0.001 (a weight plus its update)": lambda d: torch.tensor(1.0, dtype=d) + torch.tensor(0.001, dtype=d),
             "257 (an integer past bf16's 8 bits)": lambda d: torch.tensor(257.0, dtype=d)}
    return {name: {str(d).removeprefix("torch."): make(d).float().item() for d in FORMATS}
            for name, make in cases.items()}


def scaled_gradients(scale: float | None) -> dict[str, float]:
    """One fp16 backward whose true gradients are 1e-8: what reaches the fp32 master weights.

    ``y = w·x`` in fp16 from fp32 masters ``w`` (``x = 1e-4``); the loss ``1e-4 · Σ y`` is
    summed in float32, as autocast runs a loss. ``d loss / d w = 1e-8``: below fp16's smallest
    subnormal (6e-8). ``scale=None`` backpropagates the loss as it is; otherwise a
    ``torch.amp.GradScaler`` with that initial scale multiplies the float32 loss before backward
    (the loss never overflows) and ``unscale_`` divides the gradients after it. The fp16 gradient
    of ``y`` is ``1e-4 · scale``: past fp16's max (65504) at a scale above 6.5e8 it overflows;
    the scaler then skips the step and halves its scale (``update()``); after ``growth_interval``
    (2000) clean steps it doubles it. Returns the master gradient's mean, whether it is finite,
    and the scale ``update()`` sets for the next step.
    """
    master = nn.Parameter(torch.ones(4))
    optimizer = torch.optim.SGD([master], lr=0.1)
    y = master.half() * torch.full((4,), 1e-4, dtype=torch.float16)
    loss = y.float().sum() * 1e-4
    scaler = torch.amp.GradScaler("cpu", init_scale=scale or 1.0, enabled=scale is not None)
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    scaler.step(optimizer)  # skipped when a gradient is inf or nan
    scaler.update()
    return {"grad": master.grad.mean().item(), "finite": bool(torch.isfinite(master.grad).all()),
            "next scale": scaler.get_scale() if scale else 1.0}


class MasterWeights:
    """A bf16 working copy of ``model`` for forward and backward; float32 masters and Adam for the step.

    The ZeRO paper's accounting: the copy's parameters and gradients (2 + 2 bytes per
    parameter), the float32 masters and Adam's two moments (4 + 4 + 4). ``step()`` gives the
    masters float32 copies of the bf16 gradients, steps, frees them and copies back: inside
    ``step()`` they are 4 bytes more per parameter (``peak``, measured there). With
    ``main_grad=True`` it holds gradients as Megatron-LM does: each bf16 gradient is added into a
    persistent float32 ``main_grad`` buffer and freed, and the step reads the buffers: 2 + 4 + 12.
    """

    def __init__(self, model: nn.Module, lr: float = 1e-3, *, main_grad: bool = False):
        self.master = model
        self.work = copy.deepcopy(model).to(torch.bfloat16)
        self.optimizer = torch.optim.Adam(self.master.parameters(), lr=lr)
        self.main_grads = [torch.zeros_like(m) for m in self.master.parameters()] if main_grad else None
        self.peak: dict[str, int] = {}
        if main_grad:
            for w, buffer in zip(self.work.parameters(), self.main_grads):
                w.register_post_accumulate_grad_hook(functools.partial(self.accumulate, buffer=buffer))

    @staticmethod
    def accumulate(w: torch.Tensor, *, buffer: torch.Tensor) -> None:
        buffer.add_(w.grad)  # in float32; the bf16 gradient is freed at once
        w.grad = None

    def step(self) -> None:
        for i, (m, w) in enumerate(zip(self.master.parameters(), self.work.parameters())):
            m.grad = self.main_grads[i] if self.main_grads else w.grad.float()
        self.optimizer.step()
        self.peak = self.bytes()  # every float32 gradient, the bf16 ones and Adam's moments alive at once
        self.optimizer.zero_grad(set_to_none=True)  # without main_grad: frees the float32 copies
        with torch.no_grad():
            for m, w in zip(self.master.parameters(), self.work.parameters()):
                w.copy_(m)  # rounded to bf16: the masters keep what bf16 would lose
                if w.grad is not None:
                    w.grad.zero_()  # kept, as a persistent bf16 gradient buffer, for the next backward
            for buffer in self.main_grads or ():
                buffer.zero_()

    def bytes(self) -> dict[str, int]:
        """Bytes held now, per term, measured from the tensors themselves."""
        work, master = list(self.work.parameters()), list(self.master.parameters())
        held = {"bf16 parameters": sum(tensor_bytes(p) for p in work),
                "bf16 gradients": sum(tensor_bytes(p.grad) for p in work)}
        if self.main_grads:
            held["fp32 main_grad"] = sum(tensor_bytes(b) for b in self.main_grads)
        else:
            held["fp32 gradients"] = sum(tensor_bytes(m.grad) for m in master)
        return {**held, "fp32 master parameters": sum(tensor_bytes(p) for p in master),
                "Adam moments (fp32)": optimizer_state_bytes(self.optimizer)}


CURVES = ("float32", "bf16 autocast, fp32 weights", "bf16 weights")


def learning_curves(steps: int = 40, *, lr: float = 1e-4, seed: int = 0) -> dict[str, list[float]]:
    """Per way of training (``CURVES``): the losses of ``steps`` Adam steps on one fixed batch.

    The batch (``token_batch``'s step 0) repeats, so the model can learn it and the float32
    loss falls. Autocast keeps the weights, gradients and Adam state in float32 (the masters)
    and runs each matmul in bf16; "bf16 weights" stores the weights themselves in bf16, where
    an update smaller than half a weight's spacing (1/256 of it) rounds away.
    """
    curves = {}
    for kind in CURVES:
        torch.manual_seed(seed)
        model = TinyTransformer()
        if kind == "bf16 weights":
            model = model.to(torch.bfloat16)
        optimizer = torch.optim.Adam(model.parameters(), lr=lr)
        tokens, targets = token_batch(0, 1, per_rank=8, vocab=model.vocab)
        losses = []
        for _ in range(steps):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=kind.startswith("bf16 autocast")):
                loss = nn.functional.cross_entropy(model(tokens).float(), targets)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(loss.item())
        curves[kind] = losses
    return curves
