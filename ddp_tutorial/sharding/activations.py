"""Activation memory, measured: every tensor autograd saves for backward, by layer and by op.

``17_memory`` counts what a forward pass keeps alive for backward with
``torch.autograd.graph.saved_tensors_hooks``: its pack hook sees each tensor an op saves.
``SavedTensors`` records them, with the op that saved them (a ``TorchFunctionMode`` names the
``torch`` function running: ``linear``, ``softmax``, ``dropout``, ...) and the module it ran in
(forward pre-hooks). Parameters are left out (they are model state, counted by ``memory``),
and a storage saved twice, or through several views (``q``, ``k``, ``v`` of one ``qkv`` output),
counts once: bytes are what is held, not how often it is referenced.

``block_terms`` is the formula of Korthikanti et al. (2022), "Reducing Activation Recomputation
in Large Transformer Models", written per op for ``models.Block`` with ``attention="math"`` and
dropout: with ``e`` bytes per activation, ``m`` per dropout-mask element, ``T = b·s`` tokens of
width ``h`` and ``a`` heads, one block saves ``T·h·(16e + 2m) + a·s·T·(2e + m)`` bytes, plus the
LayerNorms' float32 mean and 1/std (16 bytes per token). For ``e = 2, m = 1`` (CUDA's fused
dropout keeps a bool mask) this is the paper's ``s·b·h·(34 + 5·a·s/h)``; on a CPU ``F.dropout``
multiplies by a mask of the activation's dtype (``m = e``). ``17_memory`` measures each term.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

__all__ = ["Saved", "SavedTensors", "saved_tensors", "WHAT_IS_SAVED", "AUTOCAST_FP32", "block_terms", "block_bytes",
           "by_op", "megatron_split"]


@dataclass
class Saved:
    """One storage autograd keeps for backward: who saved it first, and its size."""

    layer: str
    op: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    nbytes: int
    weight_like: bool = False  # 2-D and transposed: how linear saves a weight (autocast's copy)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


class OpNames(TorchFunctionMode):
    """Keeps the name of the outermost ``torch`` function running (``linear``, not the ``addmm`` inside)."""

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001  (torch's protocol)
        name = getattr(func, "__name__", str(func)).replace("__", "")
        self.stack.append(name)
        try:
            return func(*args, **(kwargs or {}))
        finally:
            self.stack.pop()

    @property
    def current(self) -> str:
        return self.stack[0] if self.stack else "?"


@dataclass
class SavedTensors:
    """What a ``saved_tensors`` block recorded: one ``Saved`` per storage, in the order saved."""

    items: list[Saved] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(s.nbytes for s in self.items)

    def by(self, key: str) -> dict[str, int]:
        """Bytes grouped by ``"layer"`` or ``"op"``, in first-seen order."""
        out: dict[str, int] = defaultdict(int)
        for s in self.items:
            out[getattr(s, key)] += s.nbytes
        return dict(out)

    def layer(self, name: str) -> SavedTensors:
        """Only what layer ``name`` (a module name such as ``blocks.0``) and its children saved."""
        return SavedTensors([s for s in self.items if s.layer == name or s.layer.startswith(name + ".")])


@contextmanager
def saved_tensors(model: nn.Module) -> Iterator[SavedTensors]:
    """Record every non-parameter storage that autograd saves while the block runs ``model``."""
    record = SavedTensors()
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: set[int] = set()
    where = ["(outside)"]
    ops = OpNames()

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr not in params and ptr not in seen and storage.nbytes() > 0:
            seen.add(ptr)  # saved tensors stay alive until backward, so an address names one storage
            weight_like = t.dim() == 2 and t.stride(0) == 1 and t.shape[1] > 1
            record.items.append(Saved(where[-1], ops.current, t.dtype, tuple(t.shape), storage.nbytes(), weight_like))
        return t

    def enter(name: str):  # noqa: ANN202  (a hook factory)
        return lambda module, args: where.append(name or "(model)")

    def leave(module: nn.Module, args: object, output: object) -> None:
        where.pop()

    handles = [h for name, m in model.named_modules()
               for h in (m.register_forward_pre_hook(enter(name)), m.register_forward_hook(leave))]
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), ops:
            yield record
    finally:
        for h in handles:
            h.remove()


# What each op of ``models.Block`` (attention="math") saves, as ``block_terms`` names it.
WHAT_IS_SAVED = {
    "layer_norm": "norm1's and norm2's inputs (the residual stream)",
    "layer_norm stats": "each norm's mean and 1/std: float32, per token",
    "linear": "the inputs of qkv, proj, up (h wide) and down (4h wide)",
    "matmul": "q and k (for q·kᵀ), v (for probs·v)",
    "matmul (a·s²)": "the dropped-out probabilities (for probs·v)",
    "softmax (a·s²)": "its output: softmax's backward needs it",
    "dropout (a·s²)": "the mask on the attention probabilities",
    "dropout": "the masks after proj and after down",
    "gelu": "its input (4h wide)",
}
# Under torch.autocast(dtype=bfloat16), the terms that stay float32. The residual stream is float32
# (the embedding is), so the norms' inputs are; CUDA's fp32 op list also has softmax (measured on
# CPU; CUDA's from its op list: a GPU run of the tests checks it). Not the only CPU/CUDA difference:
# CUDA's layer_norm keeps its statistics in float32 for bf16 input (CPU's in bf16), its dropout a
# 1-byte mask, and its fp32 fused attention a log-sum-exp padded to 32 queries (17_memory §5).
AUTOCAST_FP32 = {"cpu": ("layer_norm",), "cuda": ("layer_norm", "softmax (a·s²)", "dropout (a·s²)")}


def block_terms(batch: int, seq: int, hidden: int, heads: int, *, act_bytes: int = 4,
                mask_bytes: int | None = None, dropout: bool = True, autocast: str | None = None) -> dict[str, int]:
    """Korthikanti et al.'s bytes of one ``models.Block`` (attention="math"), op by op.

    Exact for that block (asserted against ``saved_tensors`` in the tests), with
    ``mask_bytes=None``: CPU's ``F.dropout`` multiplies by a mask of the activation's dtype;
    CUDA's fused dropout keeps a 1-byte bool mask (``mask_bytes=1``, the paper's). The only
    term not in the paper is the LayerNorm statistics. ``act_bytes=2, mask_bytes=1`` is the
    paper's ``s·b·h·(34 + 5·a·s/h)`` plus those; ``autocast="cpu"`` (or ``"cuda"``) keeps that
    device's ``AUTOCAST_FP32`` terms at 4 bytes and the rest at ``act_bytes``.
    """
    th, scores, tokens = batch * seq * hidden, batch * heads * seq * seq, batch * seq

    def size(op: str) -> int:
        return 4 if autocast and op in AUTOCAST_FP32[autocast] else act_bytes

    def mask(op: str) -> int:
        return size(op) if mask_bytes is None else mask_bytes

    terms = {"layer_norm": 2 * size("layer_norm") * th, "layer_norm stats": 2 * 2 * 4 * tokens,
             "linear": 7 * size("linear") * th, "matmul": 3 * size("matmul") * th,
             "matmul (a·s²)": size("matmul") * scores, "softmax (a·s²)": size("softmax (a·s²)") * scores,
             "dropout (a·s²)": mask("dropout (a·s²)") * scores, "dropout": 2 * mask("dropout") * th,
             "gelu": 4 * size("gelu") * th}
    if not dropout:  # probs·v then keeps the softmax output itself, already counted
        terms = {k: v for k, v in terms.items() if not k.startswith(("dropout", "matmul (a"))}
    return terms


def block_bytes(batch: int, seq: int, hidden: int, heads: int, **options: object) -> int:
    """The sum of ``block_terms`` (same keyword options): one block's saved bytes."""
    return sum(block_terms(batch, seq, hidden, heads, **options).values())  # type: ignore[arg-type]


def by_op(record: SavedTensors, batch: int, seq: int, hidden: int, heads: int) -> dict[str, int]:
    """Measured bytes grouped as ``block_terms`` names them; autocast's weight copies apart.

    A tensor of ``batch·heads·seq²`` elements is an ``(a·s²)`` term (so ``heads·seq`` must
    differ from 1, 3 and 4 times ``hidden``: ``ValueError``), a LayerNorm's (…, 1) float32 tensors its
    statistics, and a transposed 2-D tensor saved by ``linear`` autocast's low-precision copy
    of a weight ("weight copies": model-sized, not batch-sized).
    """
    if heads * seq in (hidden, 3 * hidden, 4 * hidden):
        raise ValueError(f"heads * seq = {heads * seq} is 1, 3 or 4 times hidden = {hidden}: the (a·s²) "
                         "tensors could not be told apart from the (s·h) ones by size")
    out: dict[str, int] = defaultdict(int)
    for s in record.items:
        key = s.op
        if s.op == "layer_norm" and s.shape[-1:] == (1,):
            key = "layer_norm stats"
        elif s.op == "linear" and s.weight_like:
            key = "weight copies"
        elif s.numel == batch * heads * seq * seq:
            key = f"{s.op} (a·s²)"
        out[key] += s.nbytes
    return dict(out)


def megatron_split(record: SavedTensors, batch: int, seq: int, heads: int, *, mask_bytes: int = 1) -> dict[str, int]:
    """A ``models.Block``'s saved bytes (``record``, attention="math") as Megatron's tensor parallelism holds them.

    ``"whole"``: what every rank keeps whole without sequence parallelism (the norms' inputs, the
    inputs of qkv and up, the dropout masks after proj and down); ``"split"``: what ``t`` ranks
    split (q, k, v, the inputs of proj and down, GELU's input); ``"a·s²"``: the attention scores'
    three tensors, split by heads. Dropout masks counted at ``mask_bytes`` per element (CUDA's
    and the paper's 1; CPU's ``F.dropout`` keeps the activation's dtype); the norms' statistics,
    which the paper leaves out, are left out. Korthikanti et al. (2022) §4.2.2 name the same split.
    """
    out = {"whole": 0, "split": 0, "a·s²": 0}
    for item in record.items:
        if item.op == "layer_norm" and item.shape[-1:] == (1,):
            continue
        nbytes = item.numel * mask_bytes if item.op == "dropout" else item.nbytes
        if item.numel == batch * heads * seq * seq:
            out["a·s²"] += nbytes
        elif item.layer in ("norm1", "norm2", "qkv", "up") or item.op == "dropout":
            out["whole"] += nbytes
        else:
            out["split"] += nbytes
    return out
