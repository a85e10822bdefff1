"""The Llama-shaped block of lesson 20 (``20_long_sequences``): ``LlamaAttention``, ``SwiGLU``, ``LlamaBlock``
and ``TinyLlama``, the model its tensor-parallel plan is applied to.
"""

from __future__ import annotations

import torch
from torch import nn


class LlamaAttention(nn.Module):
    """Causal self-attention with separate q, k, v and output projections, as Llama names them.

    The number of heads is read from ``wq``'s output size, so the same forward runs a
    tensor-parallel shard holding some of the heads.
    """

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.head_dim = dim // heads
        self.wq, self.wk, self.wv = (nn.Linear(dim, dim, bias=False) for _ in range(3))
        self.wo = nn.Linear(dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s = x.shape[:2]
        q, k, v = (w(x).view(b, s, -1, self.head_dim).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        out = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))


class SwiGLU(nn.Module):
    """Llama's MLP: ``w2(silu(w1 x) * w3 x)``."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.w1, self.w3 = nn.Linear(dim, hidden, bias=False), nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(nn.functional.silu(self.w1(x)) * self.w3(x))


class LlamaBlock(nn.Module):
    """A pre-norm Llama block (torchtitan's names): RMSNorm, attention, dropout, residual; the same with the MLP."""

    def __init__(self, dim: int = 16, heads: int = 4, *, hidden: int | None = None, dropout: float = 0.0):
        super().__init__()
        self.attention_norm, self.ffn_norm = nn.RMSNorm(dim), nn.RMSNorm(dim)
        self.attention, self.feed_forward = LlamaAttention(dim, heads), SwiGLU(dim, hidden or 4 * dim)
        self.attention_dropout, self.ffn_dropout = nn.Dropout(dropout), nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention_dropout(self.attention(self.attention_norm(x)))
        return x + self.ffn_dropout(self.feed_forward(self.ffn_norm(x)))


class TinyLlama(nn.Module):
    """Token embedding, ``layers`` Llama blocks, a final RMSNorm and an output head: logits (batch, seq, vocab)."""

    def __init__(self, vocab: int = 32, dim: int = 16, heads: int = 4, layers: int = 1):
        super().__init__()
        self.tok_embeddings = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(LlamaBlock(dim, heads) for _ in range(layers))
        self.norm, self.output = nn.RMSNorm(dim), nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tok_embeddings(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.output(self.norm(x))
