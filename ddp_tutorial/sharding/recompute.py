"""Activation checkpointing: keep less for backward, compute part of the forward again.

``17_memory`` wraps each block of a ``TinyGPT`` (``TinyTransformer`` with dropout) in ``Recomputed``:

- ``"selective"``: Korthikanti et al. (2022) §4.3's selective recomputation (Megatron's
  ``--recompute-granularity selective``): only the attention core (``Block.attend``: q·kᵀ,
  softmax, dropout, probs·v, the ``a·s²`` terms) runs under a checkpoint, which keeps its
  inputs q, k, v; everything else is kept as without recomputation;
- ``"keep-matmuls"``: this course's op-level policy (torchtitan's op-SAC is of this kind):
  the whole block under ``create_selective_checkpoint_contexts``, the matmuls' outputs kept
  (expensive to compute, ``MATMULS``), the pointwise ops (GELU, softmax, dropout, layer norm)
  computed again. It keeps the q·kᵀ scores, so it is *not* the paper's "selective";
- ``"full"``: ``torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)`` keeps only
  the block's input; backward runs the block's forward again to get everything else back
  (about one forward more per step: 4/3 of the matmul FLOPs, since backward is about 2 forwards).

Saved-tensor hooks cannot see what a checkpoint keeps (it holds the block's input itself,
and its own hooks replace ours inside the block), so ``held_after_forward`` measures the other
way: every storage an op creates during forward, still alive once forward returned, is
what the graph holds for backward. Without checkpointing it equals ``activations``' count.
``peak_during_backward`` follows the same storages through backward: the most bytes alive at
once, which is where one checkpoint around a whole stack loses (it rebuilds every block at once).
"""

from __future__ import annotations

import functools
import gc
import warnings
from collections.abc import Callable

import torch
from torch import nn
from torch.multiprocessing.reductions import StorageWeakRef  # no public path; torch's own code watches storages so
from torch.utils._python_dispatch import TorchDispatchMode  # no public path; the one "Extending PyTorch" teaches
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts
from torch.utils.flop_counter import FlopCounterMode

from ddp_tutorial.models import TinyGPT, token_batch
from ddp_tutorial.timing import timed

__all__ = ["MODES", "MATMULS", "Recomputed", "recompute_blocks", "held_after_forward", "peak_during_backward",
           "step_flops", "keep_matmuls", "tradeoff"]

MODES = ("none", "selective", "keep-matmuls", "full")
aten = torch.ops.aten
MATMULS = (aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default)


def keep_matmuls(ctx: object, op: object, *args: object, **kwargs: object) -> CheckpointPolicy:
    """The ``"keep-matmuls"`` policy: save what a matmul returns, recompute everything else."""
    return CheckpointPolicy.MUST_SAVE if op in MATMULS else CheckpointPolicy.PREFER_RECOMPUTE


class Recomputed(nn.Module):
    """A ``models.Block`` whose activations are recomputed in backward (``mode``: one of ``MODES`` but "none")."""

    def __init__(self, block: nn.Module, mode: str = "full"):
        super().__init__()
        if mode not in MODES[1:]:
            raise ValueError(f"mode must be one of {MODES[1:]}, not {mode!r}")
        self.block, self.mode = block, mode
        if mode == "selective":  # the attention core alone under a checkpoint, which keeps q, k, v
            # a partial, not a lambda: copy.deepcopy then points it at the copied block
            block.attend = functools.partial(checkpoint, type(block).attend, block, use_reentrant=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.mode == "selective":
            return self.block(x)
        if self.mode == "keep-matmuls":
            context = functools.partial(create_selective_checkpoint_contexts, keep_matmuls)
            return checkpoint(self.block, x, use_reentrant=False, context_fn=context)
        return checkpoint(self.block, x, use_reentrant=False)


def recompute_blocks(model: nn.Module, mode: str) -> nn.Module:
    """``model`` (a ``TinyTransformer`` or ``TinyGPT``) with each of its ``blocks`` wrapped in ``Recomputed``, in place.

    ``"none"`` leaves it as it is. Parameter names gain ``.block`` (``blocks.0.block.qkv.weight``).
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
    if mode != "none":
        model.blocks = nn.ModuleList(Recomputed(b, mode) for b in model.blocks)
    return model


class NewStorages(TorchDispatchMode):
    """Remembers, by weak reference, every storage that an op's output lives in; with ``watch``,
    also the most bytes of them alive at once after any op (``peak``)."""

    def __init__(self, watch: bool = False) -> None:
        super().__init__()
        self.refs: dict[int, tuple[StorageWeakRef, int]] = {}
        self.watch, self.peak = watch, 0

    def alive(self) -> int:
        return sum(n for ref, n in self.refs.values() if not ref.expired())

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001  (torch's protocol)
        out = func(*args, **(kwargs or {}))
        for t in (out if isinstance(out, (tuple, list)) else (out,)):
            if isinstance(t, torch.Tensor):
                s = t.untyped_storage()
                self.refs[s.data_ptr()] = (StorageWeakRef(s), s.nbytes())
        if self.watch:
            self.refs = {ptr: (ref, n) for ptr, (ref, n) in self.refs.items() if not ref.expired()}
            self.peak = max(self.peak, self.alive())
        return out


def held_after_forward(model: nn.Module, *inputs: torch.Tensor, targets: torch.Tensor | None = None) -> int:
    """Bytes that ``model(*inputs)`` leaves alive for backward, besides its output and the parameters.

    With ``targets``, forward includes the cross-entropy loss of the output (logits). A storage
    whose last reference is gone is freed at once (reference counting), so what is still alive
    when forward returns is what autograd's graph (or a checkpoint) keeps.
    """
    with NewStorages() as mode:
        out = model(*inputs)
        if targets is not None:
            out = nn.functional.cross_entropy(out, targets)
    gc.collect()  # garbage kept only by a reference cycle is not kept for backward: free it first
    keep = {p.untyped_storage().data_ptr() for p in model.parameters()}
    keep |= {t.untyped_storage().data_ptr() for t in (out, *inputs)}
    held = sum(n for ptr, (ref, n) in mode.refs.items() if ptr not in keep and not ref.expired())
    del out
    return held


def peak_during_backward(model: nn.Module, *inputs: torch.Tensor) -> dict:
    """Bytes alive when ``model(*inputs)``'s forward has ended, and the most alive at once until its backward ends.

    Of the storages ops create (activations, recomputed ones, gradients), not the inputs or the
    parameters; the loss is a fixed weighting of the output. ``"after forward"`` is
    ``held_after_forward``'s count; ``"peak"`` adds what backward allocates: the gradients and,
    with checkpoints, what each recomputation rebuilds while it is needed. ``"output"``: the
    output, its gradients now in the inputs' and parameters' ``.grad``.
    """
    with NewStorages(watch=True) as mode:
        out = model(*inputs)
        gc.collect(1)  # the young generations, where forward's reference cycles are: a full collection is slow
        keep = {p.untyped_storage().data_ptr() for p in model.parameters()}
        keep |= {t.untyped_storage().data_ptr() for t in (out, *inputs) if isinstance(t, torch.Tensor)}
        held = sum(n for ptr, (ref, n) in mode.refs.items() if ptr not in keep and not ref.expired())
        if isinstance(out, torch.Tensor) and out.requires_grad:  # else there is no backward to follow
            (out * torch.linspace(-1, 1, out.numel(), device=out.device).view_as(out)).sum().backward()
    return {"after forward": held, "peak": mode.peak, "output": out}


def step_flops(step: Callable[[], object]) -> int:
    """The FLOPs ``step()`` runs, as torch's ``FlopCounterMode`` counts them (matmuls and attention)."""
    with FlopCounterMode(display=False) as counter:
        step()
    return counter.get_total_flops()


def tradeoff(model_kwargs: dict, *, batch: int = 4, seq: int = 64, repeat: int = 3,
             device: torch.device | str = "cpu") -> list[dict]:
    """Per mode (``MODES``): bytes held after forward, FLOPs and best time of a step, on ``device``.

    The ratios are to ``"none"`` in the same run; the same seed (same weights, same dropout
    masks) in every mode, so the gradients are equal too (``"same grads"``).
    """
    tokens, targets = token_batch(0, 1, per_rank=batch, seq=seq, vocab=model_kwargs.get("vocab", 32), device=device)
    rows, reference = [], None
    for mode in MODES:
        torch.manual_seed(0)
        model = recompute_blocks(TinyGPT(**model_kwargs), mode).to(device)

        def step() -> None:
            model.zero_grad(set_to_none=True)
            torch.manual_seed(1)
            nn.functional.cross_entropy(model(tokens), targets).backward()

        with warnings.catch_warnings():  # newer torch asks SAC whether to respect outer saved-tensor hooks
            warnings.simplefilter("ignore", FutureWarning)
            held = held_after_forward(model, tokens, targets=targets)
            flops, seconds = step_flops(step), timed(step, repeat=repeat)
        grads = [p.grad.clone() for p in model.parameters()]
        reference = reference or {"held": held, "flops": flops, "seconds": seconds, "grads": grads}
        rows.append({"mode": mode, "held": held, "flops": flops, "seconds": seconds,
                     "held ratio": held / reference["held"], "flops ratio": flops / reference["flops"],
                     "time ratio": seconds / reference["seconds"],
                     "same grads": all(torch.allclose(g, r, atol=1e-6) for g, r in zip(grads, reference["grads"]))})
    return rows
