"""Lesson 17's exercise: checkpoint every block, so that forward keeps only the blocks' inputs.

Each rank checks on its own (no collective is involved; every world size runs the same
cases from rank-dependent seeds). The reference is the plain loop over the same blocks,
with the same dropout masks (the same seed). The answer is judged by what it does, not by
which function it calls (``torch.utils.checkpoint.checkpoint``, torch's ``checkpoint_wrapper``
or another way): the output, ``x.grad`` and every parameter's gradient must equal the
reference's; the bytes forward leaves alive must not exceed one block input per block; the most
bytes alive during backward must not exceed one checkpoint per block's (both measured by
``recompute.peak_during_backward``); and no
reentrant checkpoint may be left in the autograd graph.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from ddp_tutorial.exercises.exercise import Exercise
from ddp_tutorial.exercises.harness import Case, Report, load_function, run_cases
from ddp_tutorial.exercises.tracing import traced
from ddp_tutorial.models import Block
from ddp_tutorial.sharding.recompute import peak_during_backward

# (blocks, batch, seq, hidden, heads)
SHAPES = [(3, 2, 8, 16, 2), (1, 1, 5, 8, 1), (2, 3, 6, 24, 3)]


class Stack(nn.Module):
    """The blocks run by ``fn``: a module, so that the measurements know the parameters."""

    def __init__(self, blocks: nn.ModuleList, fn: object):
        super().__init__()
        self.blocks, self.fn = blocks, fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(self.blocks, x)


def plain(blocks: nn.ModuleList, x: torch.Tensor) -> torch.Tensor:
    for block in blocks:
        x = block(x)
    return x


def per_block(blocks: nn.ModuleList, x: torch.Tensor) -> torch.Tensor:
    """The checker's own bound: one non-reentrant checkpoint per block."""
    for block in blocks:
        x = checkpoint(block, x, use_reentrant=False)
    return x


def reentrant(out: torch.Tensor) -> bool:
    """Whether the graph behind ``out`` holds a reentrant checkpoint (``use_reentrant=True``'s node)."""
    seen, todo = set(), [out.grad_fn]
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if type(node).__name__ == "CheckpointFunctionBackward":
            return True
        todo.extend(next_fn for next_fn, _ in node.next_functions)
    return False


def measure(fn: object, blocks: nn.ModuleList, x: torch.Tensor, seed: int) -> dict:
    """``fn``'s output and gradients (x's first), the bytes alive after forward and the most during backward."""
    x = x.clone().requires_grad_()
    blocks.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    alive = peak_during_backward(Stack(blocks, fn), x)  # the loss: a fixed weighting of the output
    y = alive["output"]
    return {"held": alive["after forward"], "peak": alive["peak"], "out": y,
            "reentrant": isinstance(y, torch.Tensor) and y.grad_fn is not None and reentrant(y),
            "grads": [x.grad] + [p.grad for p in blocks.parameters()]}


def diagnose(got: dict, want: dict, plain_held: int, n_blocks: int, block_input: int) -> str | None:
    """What is wrong with the bytes the answer keeps (None: right); ``want`` is one checkpoint per block's."""
    bound = n_blocks * block_input
    if got["held"] >= plain_held:
        return ("forward left as much as the plain loop alive for backward: no block's activations were "
                "dropped; run each block under a checkpoint (torch.utils.checkpoint)")
    if got["held"] > bound:
        per_block_extra = (plain_held - bound) / n_blocks  # what one block keeps beyond its input
        kept = round((got["held"] - bound) / per_block_extra)
        return (f"forward left {got['held']} bytes alive for backward; the blocks' inputs are {bound} bytes: "
                f"about {kept} of {n_blocks} blocks keep all their activations (checkpoint_sequential runs its "
                "last segment without a checkpoint): checkpoint every block")
    if got["peak"] > want["peak"] + block_input:
        return (f"during backward {got['peak']} bytes were alive at once, against {want['peak']} with one "
                f"checkpoint per block: one checkpoint around all {n_blocks} blocks keeps almost nothing after "
                "forward, but backward then recomputes the whole stack at once and holds every block's "
                "activations together; checkpoint each block on its own")
    if got["reentrant"]:
        return ("a reentrant checkpoint is in the graph (use_reentrant=True, or checkpoint_wrapper's "
                "CheckpointImpl.REENTRANT): run it without it, with use_reentrant=False, the variant torch "
                "recommends (it supports torch.autograd.grad and inputs that need no grad)")
    return None


def checkpointed_forward_worker(rank: int, world_size: int, source: str, function: str, trace_dir: str) -> Report:
    """Each shape: output, gradients and bytes against the plain loop and one checkpoint per block."""
    with traced(rank, trace_dir) as trace:
        fn = load_function(source, function, refuse=("ddp_tutorial.sharding.recompute",))

        def case(n_blocks: int, batch: int, seq: int, hidden: int, heads: int, seed: int) -> str | None:
            torch.manual_seed(100 * seed + rank)
            blocks = nn.ModuleList(Block(hidden, heads, dropout=0.1, attention="math") for _ in range(n_blocks))
            x = torch.randn(batch, seq, hidden)
            want, bound = measure(plain, blocks, x, seed), measure(per_block, blocks, x, seed)
            got = measure(fn, blocks, x, seed)
            out = got["out"]
            if not isinstance(out, torch.Tensor) or out.shape != want["out"].shape:
                return (f"returned {type(out).__name__} {getattr(out, 'shape', '')}, not a tensor of shape "
                        f"{tuple(want['out'].shape)}")
            if not torch.allclose(out, want["out"], atol=1e-6):
                return ("the output differs from the plain loop over the blocks by up to "
                        f"{(out - want['out']).abs().max().item():.3g}: every block, in order, each on the previous output")
            if not out.requires_grad:
                return "the output carries no autograd graph: no torch.no_grad() or .detach()"
            for i, (g, w) in enumerate(zip(got["grads"], want["grads"])):
                if g is None or not torch.allclose(g, w, atol=1e-6):
                    what = "x.grad" if i == 0 else f"the gradient of parameter {i - 1}"
                    return (f"{what} differs from the plain loop's: did a checkpoint run with "
                            "preserve_rng_state=False (dropout then draws another mask in recompute)?")
            return diagnose(got, bound, want["held"], n_blocks, x.numel() * x.element_size())

        cases: list[Case] = [(f"{n} blocks, batch {b}, seq {s}, hidden {h}, heads {a}",
                              lambda n=n, b=b, s=s, h=h, a=a, k=k: case(n, b, s, h, a, k))
                             for k, (n, b, s, h, a) in enumerate(SHAPES)]
        return run_cases(trace, cases)


EXERCISES = [
    Exercise(
        name="checkpointed_forward", number="17.1", lesson=17, notebook="17_memory.ipynb",
        title="checkpoint every block: keep only the blocks' inputs", level="warm-up",
        task=("Run x through a stack of transformer blocks so that forward keeps only each block's input for "
              "backward, and backward never holds more than one block's rebuilt activations at a time, with the "
              "same output and the same gradients as the plain loop (dropout included)."),
        hint=("torch.utils.checkpoint.checkpoint(fn, *args, use_reentrant=False) runs fn(*args) keeping only "
              "args, and runs fn again in backward. Around what should it go: the stack, or each block? "
              "Compare the bytes alive during backward."),
        checks=("three stacks of 1-3 blocks with dropout 0.1, each rank on its own seeds; the output, x.grad and "
                "every parameter's gradient against the plain loop with the same dropout masks; the bytes forward "
                "leaves alive at most one block input per block; the most bytes alive during backward at most "
                "one checkpoint per block's; no reentrant checkpoint; any way of checkpointing counts; "
                "ddp_tutorial.sharding.recompute is refused"),
        worker=checkpointed_forward_worker),
]
