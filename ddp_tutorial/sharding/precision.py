"""Mixed precision: what bf16 and fp16 can hold, loss scaling, fp32 master weights, and their bytes.

``17_memory`` shows where each 16-bit format breaks (``breaking_points``), rescues fp16's
gradients with a loss scale (``scaled_gradients``, ``torch.amp.GradScaler``), counts the
ZeRO paper's 2 + 2 + 12 bytes per parameter on real tensors (``MasterWeights``), and trains
the same model in float32 and under ``torch.autocast(dtype=torch.bfloat16)`` (``train_losses``).
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from ddp_tutorial.models import TinyTransformer, token_batch
from ddp_tutorial.sharding.memory import optimizer_state_bytes, tensor_bytes

__all__ = ["FORMATS", "format_limits", "breaking_points", "scaled_gradients", "MasterWeights", "train_losses"]

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

    ``loss = 1e-4 · Σ wᵢ·xᵢ`` with ``x = 1e-4``, computed in fp16 from fp32 masters ``w``:
    ``d loss / d w = 1e-8``, below fp16's smallest subnormal (6e-8). ``scale=None``
    backpropagates the loss as it is; otherwise a ``torch.amp.GradScaler`` with that initial
    scale multiplies the loss before backward and ``unscale_`` divides the gradients after it,
    in float32. A scale past fp16's max (65504) overflows instead: the scaler would skip that
    step and halve its scale. Returns the master gradient's mean, and whether it is finite.
    """
    master = nn.Parameter(torch.ones(4))
    optimizer = torch.optim.SGD([master], lr=0.1)
    x = torch.full((4,), 1e-4, dtype=torch.float16)
    loss = (master.half() * x).sum() * 1e-4
    scaler = torch.amp.GradScaler("cpu", init_scale=scale or 1.0, enabled=scale is not None)
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    return {"grad": master.grad.mean().item(), "finite": bool(torch.isfinite(master.grad).all())}


class MasterWeights:
    """A bf16 working copy of ``model`` for forward and backward; float32 masters and Adam for the step.

    The ZeRO paper's accounting: the copy's parameters and gradients (2 + 2 bytes per
    parameter), the float32 masters and Adam's two moments (4 + 4 + 4). ``step()`` copies the
    bf16 gradients to the masters, steps, frees the masters' gradients and copies back.
    """

    def __init__(self, model: nn.Module, lr: float = 1e-3):
        self.master = model
        self.work = copy.deepcopy(model).to(torch.bfloat16)
        self.optimizer = torch.optim.Adam(self.master.parameters(), lr=lr)

    def step(self) -> None:
        for m, w in zip(self.master.parameters(), self.work.parameters()):
            m.grad = w.grad.float()  # float32 only for the update, freed below
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        with torch.no_grad():
            for m, w in zip(self.master.parameters(), self.work.parameters()):
                w.copy_(m)  # rounded to bf16: the masters keep what bf16 would lose

    def bytes(self) -> dict[str, int]:
        """Bytes held now, per term, measured from the tensors themselves."""
        work = list(self.work.parameters())
        return {"bf16 parameters": sum(tensor_bytes(p) for p in work),
                "bf16 gradients": sum(tensor_bytes(p.grad) for p in work),
                "fp32 master parameters": sum(tensor_bytes(p) for p in self.master.parameters()),
                "Adam moments (fp32)": optimizer_state_bytes(self.optimizer)}


def train_losses(steps: int = 20, *, autocast: bool = False, lr: float = 3e-3, seed: int = 0,
                 model_kwargs: dict | None = None) -> list[float]:
    """The losses of ``steps`` Adam steps on ``token_batch``, in float32 or under bf16 autocast.

    Autocast keeps the parameters, gradients and optimizer in float32 (they are the masters)
    and runs each matmul in bf16.
    """
    torch.manual_seed(seed)
    model = TinyTransformer(**(model_kwargs or {}))
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    losses = []
    for step in range(steps):
        tokens, targets = token_batch(step, 1, per_rank=8, vocab=model.vocab)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = nn.functional.cross_entropy(model(tokens), targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses
