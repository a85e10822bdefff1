"""The capstone's GPT (``22_capstone``): ``rotary`` positions, ``GPTAttention`` (with a hook for context
parallelism), ``GPTFeedForward``, ``GPTBlock`` and ``CharGPT``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn


def rotary(x: torch.Tensor, offset: int = 0) -> torch.Tensor:
    """Rotary position embedding of ``x`` (batch, heads, seq, head_dim): pairs of features turned by an
    angle that grows with the position (``offset`` is the first one's: a sequence shard's start).

    No parameters, so no parallelism has anything to shard or gather for positions.
    """
    seq, dim = x.shape[-2], x.shape[-1]
    freqs = 1.0 / 10000 ** (torch.arange(0, dim, 2, dtype=torch.float64, device=x.device) / dim)
    angles = torch.arange(offset, offset + seq, dtype=torch.float64, device=x.device)[:, None] * freqs
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).flatten(-2)


class GPTAttention(nn.Module):
    """Causal multi-head self-attention with rotary positions; separate ``wq``, ``wk``, ``wv``, ``wo``.

    Separate projections (no fused qkv) let tensor parallelism give each rank whole heads:
    ``ColwiseParallel`` on ``wq``/``wk``/``wv`` cuts their outputs head by head. The number of
    heads is read from the tensor (``-1``), so a rank holding ``heads / tp`` of them runs the same code.
    ``context``, when set, replaces rotary + causal attention over ``x``'s positions: a callable
    ``(q, k, v) -> out`` on (batch, heads, seq, head_dim), such as context parallelism's ring
    attention over a sequence shard (the capstone's ``parallelize.apply_cp`` sets it).
    """

    def __init__(self, dim: int, heads: int, *, context: Callable[..., torch.Tensor] | None = None):
        super().__init__()
        self.head_dim = dim // heads
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(dim, dim, bias=False) for _ in range(4))
        self.context = context

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = (w(x).view(b, t, -1, self.head_dim).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        if self.context is not None:
            out = self.context(q, k, v)
        else:
            out = nn.functional.scaled_dot_product_attention(rotary(q), rotary(k), v, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(b, t, -1))


class GPTFeedForward(nn.Module):
    """Linear up to ``4 dim``, GELU, linear down: the block's MLP (``w1`` column-, ``w2`` row-parallel under TP)."""

    def __init__(self, dim: int):
        super().__init__()
        self.w1, self.w2 = nn.Linear(dim, 4 * dim, bias=False), nn.Linear(4 * dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(nn.functional.gelu(self.w1(x)))


class GPTBlock(nn.Module):
    """Pre-norm decoder block: ``x + attention(norm(x))``, then ``x + feed_forward(norm(x))``."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.attention_norm, self.attention = nn.LayerNorm(dim), GPTAttention(dim, heads)
        self.ffn_norm, self.feed_forward = nn.LayerNorm(dim), GPTFeedForward(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x))
        return x + self.feed_forward(self.ffn_norm(x))


class CharGPT(nn.Module):
    """A decoder-only GPT on characters (``22_capstone``): embedding, ``layers`` blocks, norm, output head.

    Names follow torchtitan's Llama (``tok_embeddings``, ``layers``, ``norm``, ``output``) so its
    parallelisation plans read the same. ``layers`` is a ``ModuleDict`` keyed ``"0"``, ``"1"``, ...:
    a pipeline stage deletes the blocks it does not run and keeps the names of the others, and
    sets ``tok_embeddings`` (all but the first stage) or ``norm`` and ``output`` (all but the
    last) to ``None``; ``forward`` skips what is ``None``. Returns logits (batch, seq, vocab).
    """

    def __init__(self, vocab: int = 32, dim: int = 32, heads: int = 4, layers: int = 4):
        super().__init__()
        self.heads = heads
        self.tok_embeddings: nn.Module | None = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleDict({str(i): GPTBlock(dim, heads) for i in range(layers)})
        self.norm: nn.Module | None = nn.LayerNorm(dim)
        self.output: nn.Module | None = nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens) if self.tok_embeddings is not None else tokens
        for layer in self.layers.values():
            h = layer(h)
        h = self.norm(h) if self.norm is not None else h
        return self.output(h) if self.output is not None else h
