"""The capstone's reference: ``CharGPT`` trained by one process on the whole global batch (``22_capstone``).

Every composed layout must reproduce this run: the same model (one seed), the same batches
(``chars.char_batch``), the same Adam steps. ``GPTRun`` holds every number both share, so a
layout and the reference can only differ in how the work is split. A few hundred steps take
the loss from ``ln 32 = 3.47`` (a uniform guess over the alphabet) to about 0.55: the grammar's
words and their order are learned; the random choices between them cannot be.

    python -m ddp_tutorial.capstone.reference                 # 300 steps: the loss curve, a sample
    python -m ddp_tutorial.capstone.reference --steps 100 --plot loss.png
"""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass

import torch
from torch import nn

from ddp_tutorial.capstone.chars import VOCAB, char_batch, decode, encode
from ddp_tutorial.models import CharGPT

__all__ = ["GPTRun", "make_gpt", "next_char_loss", "train_one_process", "sample", "main"]


@dataclass(frozen=True)
class GPTRun:
    """The model's sizes and the training's numbers, shared by the reference and every layout."""

    dim: int = 32
    heads: int = 4
    layers: int = 4
    seq: int = 16
    global_batch: int = 8
    microbatches: int = 2  # per data-parallel replica, when pipelined (and at least one per stage)
    lr: float = 1e-2
    seed: int = 0
    dtype: torch.dtype = torch.float64  # the comparisons' precision; the curve runs in float32

    def model_limits(self) -> dict[str, int]:
        """What ``layout.layout_problems`` needs to know of this run."""
        return {"heads": self.heads, "layers": self.layers, "seq": self.seq, "global_batch": self.global_batch,
                "microbatches": self.microbatches}

    def as_dict(self) -> dict:
        return asdict(self)


def make_gpt(run: GPTRun) -> CharGPT:
    """The run's ``CharGPT``, the same weights in every process (seeded here), in ``run.dtype``."""
    torch.manual_seed(run.seed)
    return CharGPT(VOCAB, run.dim, run.heads, run.layers).to(run.dtype)


def next_char_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of (batch, seq, vocab) logits against (batch, seq) next characters."""
    return nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())


def train_one_process(run: GPTRun, steps: int) -> dict:
    """``steps`` Adam steps on the global batches: the loss of each step and the final weights."""
    model = make_gpt(run)
    optimizer = torch.optim.Adam(model.parameters(), lr=run.lr)
    losses = []
    for step in range(steps):
        inputs, targets = char_batch(step, run.global_batch, run.seq, seed=run.seed)
        loss = next_char_loss(model(inputs), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return {"losses": losses, "state": {n: p.detach().clone() for n, p in model.named_parameters()},
            "model": model}


@torch.no_grad()
def sample(model: CharGPT, prompt: str, length: int, *, seq: int) -> str:
    """``length`` characters after ``prompt``, each the most likely next one (greedy: no randomness)."""
    tokens = encode(prompt)
    for _ in range(length):
        logits = model(tokens[-seq:][None])[0, -1]
        tokens = torch.cat([tokens, logits.argmax().reshape(1)])
    return decode(tokens)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--plot", default=None, help="save the loss curve to this image file")
    args = parser.parse_args()
    run = GPTRun(global_batch=32, seq=32, dtype=torch.float32)
    result = train_one_process(run, args.steps)
    losses = result["losses"]
    for step in range(0, args.steps, max(1, args.steps // 10)):
        print(f"step {step:4d}: loss {losses[step]:.2f}")
    print(f"step {args.steps - 1:4d}: loss {losses[-1]:.2f}")
    print("sample:", repr(sample(result["model"], "the ", 40, seq=run.seq)))
    if args.plot:
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 3.5))
        ax.plot(losses)
        ax.set(title="CharGPT, one process", xlabel="step", ylabel="cross-entropy")
        fig.tight_layout()
        fig.savefig(args.plot)
        print(f"saved {args.plot}")


if __name__ == "__main__":
    main()
