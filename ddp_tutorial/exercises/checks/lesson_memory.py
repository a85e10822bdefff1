"""Lesson 17's exercise: checkpoint every block, so that forward keeps only the blocks' inputs.

Each rank checks on its own (no collective is involved; every world size runs the same
cases from rank-dependent seeds). The reference is the plain loop over the same blocks,
with the same dropout masks (the same seed). The checker records every call of
``torch.utils.checkpoint.checkpoint`` the learner's code makes (patched before the file is
loaded) and measures the bytes forward leaves alive (``recompute.held_after_forward``): the
output, ``x.grad`` and every parameter's gradient must equal the reference's; the bytes held
must not exceed one block input per block; one non-reentrant checkpoint per block.
"""

from __future__ import annotations

import torch
import torch.utils.checkpoint as torch_checkpoint
from torch import nn

from ddp_tutorial.exercises.exercise import Exercise
from ddp_tutorial.exercises.harness import Case, Report, load_function, run_cases
from ddp_tutorial.exercises.tracing import traced
from ddp_tutorial.models import Block
from ddp_tutorial.sharding.recompute import held_after_forward

# (blocks, batch, seq, hidden, heads)
SHAPES = [(3, 2, 8, 16, 2), (1, 1, 5, 8, 1), (2, 3, 6, 24, 3)]


class Stack(nn.Module):
    """The blocks run by ``fn``: a module, so that ``held_after_forward`` knows the parameters."""

    def __init__(self, blocks: nn.ModuleList, fn: object):
        super().__init__()
        self.blocks, self.fn = blocks, fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(self.blocks, x)


def plain(blocks: nn.ModuleList, x: torch.Tensor) -> torch.Tensor:
    for block in blocks:
        x = block(x)
    return x


def run(fn: object, blocks: nn.ModuleList, x: torch.Tensor, seed: int) -> tuple[object, int, list]:
    """``fn``'s output, the bytes its forward left alive, and the gradients of a fixed loss (x's first)."""
    x = x.clone().requires_grad_()
    blocks.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    held = held_after_forward(Stack(blocks, fn), x)  # forward once to measure, then again for gradients
    torch.manual_seed(seed)
    out = fn(blocks, x)
    if isinstance(out, torch.Tensor) and out.requires_grad:
        (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
    grads = [x.grad] + [p.grad for p in blocks.parameters()]
    return out, held, grads


def diagnose(calls: list[dict], n_blocks: int, held: int, bound: int, plain_held: int) -> str | None:
    """What is wrong with how the checkpoints were used (None: right)."""
    if not calls:
        kind = "as much as the plain loop" if held >= plain_held else f"{held} bytes"
        return (f"forward left {kind} alive for backward, and torch.utils.checkpoint.checkpoint was never "
                "called: wrap each block in checkpoint(block, x, use_reentrant=False)")
    if any(c.get("use_reentrant", None) is not False for c in calls):
        return ("checkpoint was called without use_reentrant=False: pass it explicitly (the reentrant variant "
                "is the old one; torch warns, and asks you to choose)")
    if len(calls) == 1 and n_blocks > 1:
        return (f"one checkpoint around all {n_blocks} blocks: forward keeps almost nothing, but backward then "
                "recomputes the whole stack at once and holds every block's activations together; "
                "checkpoint each block on its own")
    if len(calls) != n_blocks:
        return (f"checkpoint was called {len(calls)} times for {n_blocks} blocks: once per block "
                "(checkpoint_sequential runs its last segment without a checkpoint)")
    if held > bound:
        return (f"forward left {held} bytes alive for backward; the blocks' inputs are {bound} bytes: is every "
                "block's output passed to the next block, and nothing else kept?")
    return None


def checkpointed_forward_worker(rank: int, world_size: int, source: str, function: str, trace_dir: str) -> Report:
    """Each shape: output, gradients and held bytes against the plain loop; one checkpoint per block."""
    calls: list[dict] = []
    original = torch_checkpoint.checkpoint

    def recording(fn, *args, **kwargs):  # noqa: ANN001, ANN202  (checkpoint's own signature)
        calls.append(kwargs)
        return original(fn, *args, **kwargs)

    torch_checkpoint.checkpoint = recording  # before the file is loaded: its import sees the recorder
    try:
        with traced(rank, trace_dir) as trace:
            fn = load_function(source, function, refuse=("ddp_tutorial.sharding.recompute",))

            def case(n_blocks: int, batch: int, seq: int, hidden: int, heads: int, seed: int) -> str | None:
                torch.manual_seed(100 * seed + rank)
                blocks = nn.ModuleList(Block(hidden, heads, dropout=0.1, attention="math") for _ in range(n_blocks))
                x = torch.randn(batch, seq, hidden)
                want, plain_held, want_grads = run(plain, blocks, x, seed)
                calls.clear()
                got, held, grads = run(fn, blocks, x, seed)
                if not isinstance(got, torch.Tensor) or got.shape != want.shape:
                    return f"returned {type(got).__name__} {getattr(got, 'shape', '')}, not a tensor of shape {tuple(want.shape)}"
                if not torch.allclose(got, want, atol=1e-6):
                    return ("the output differs from the plain loop over the blocks by up to "
                            f"{(got - want).abs().max().item():.3g}: every block, in order, each on the previous output")
                if not got.requires_grad:
                    return "the output carries no autograd graph: no torch.no_grad() or .detach()"
                calls_now = calls[: len(calls) // 2]  # run() called fn twice: measured, then for gradients
                wrong = diagnose(calls_now, n_blocks, held, n_blocks * x.numel() * x.element_size(), plain_held)
                if wrong:
                    return wrong
                for i, (g, w) in enumerate(zip(grads, want_grads)):
                    if g is None or not torch.allclose(g, w, atol=1e-6):
                        what = "x.grad" if i == 0 else f"the gradient of parameter {i - 1}"
                        return (f"{what} differs from the plain loop's: did a checkpoint run with "
                                "preserve_rng_state=False (dropout then draws another mask in recompute)?")
                return None

            cases: list[Case] = [(f"{n} blocks, batch {b}, seq {s}, hidden {h}, heads {a}",
                                  lambda n=n, b=b, s=s, h=h, a=a, k=k: case(n, b, s, h, a, k))
                                 for k, (n, b, s, h, a) in enumerate(SHAPES)]
            return run_cases(trace, cases)
    finally:
        torch_checkpoint.checkpoint = original


EXERCISES = [
    Exercise(
        name="checkpointed_forward", number="17.1", lesson=17, notebook="17_memory.ipynb",
        title="checkpoint every block: keep only the blocks' inputs", level="warm-up",
        task=("Run x through a stack of transformer blocks so that forward keeps only each block's input for "
              "backward, with the same output and the same gradients as the plain loop (dropout included)."),
        hint=("torch.utils.checkpoint.checkpoint(fn, *args, use_reentrant=False) runs fn(*args) keeping only "
              "args, and runs fn again in backward. Around what should it go: the stack, or each block?"),
        checks=("three stacks of 1-3 blocks with dropout 0.1, each rank on its own seeds; the output, x.grad and "
                "every parameter's gradient against the plain loop with the same dropout masks; the bytes forward "
                "leaves alive at most one block input per block; checkpoint called once per block with "
                "use_reentrant=False; ddp_tutorial.sharding.recompute is refused"),
        worker=checkpointed_forward_worker),
]
