"""The Llama-shaped block of lesson 20 (``20_long_sequences``): ``LlamaAttention`` (rotary positions, grouped-query
attention), ``tp_heads``, ``SwiGLU``, ``LlamaBlock`` and ``TinyLlama``, the model its tensor-parallel plan is
applied to.
"""

from __future__ import annotations

import torch
from torch import nn

from ddp_tutorial.models.gpt import rotary


class LlamaAttention(nn.Module):
    """Causal self-attention with separate q, k, v and output projections, as Llama names them, with
    grouped-query attention (``kv_heads`` K/V heads, each serving ``heads / kv_heads`` query heads)
    and rotary positions on q and k.

    The numbers of heads are read from ``wq``'s and ``wk``'s output sizes, so the same forward runs a
    tensor-parallel shard holding some of the heads (``tp`` must divide ``kv_heads``: ``tp_heads``).
    """

    def __init__(self, dim: int, heads: int, kv_heads: int | None = None):
        super().__init__()
        kv_heads = kv_heads or heads
        if heads % kv_heads:
            raise ValueError(f"{heads} query heads do not share {kv_heads} K/V heads equally")
        self.head_dim = dim // heads
        self.wq = nn.Linear(dim, dim, bias=False)
        self.wk, self.wv = (nn.Linear(dim, kv_heads * self.head_dim, bias=False) for _ in range(2))
        self.wo = nn.Linear(dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s = x.shape[:2]
        q, k, v = (w(x).view(b, s, -1, self.head_dim).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        q, k = rotary(q), rotary(k)  # models.gpt's: positions 0 .. seq-1 of the whole sequence
        group = q.shape[1] // k.shape[1]  # query heads per K/V head: the same on a shard
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        out = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))


def tp_heads(heads: int, kv_heads: int, tp: int) -> tuple[int, int]:
    """The query and K/V heads each of ``tp`` ranks holds; ``tp`` must divide ``kv_heads`` (and so ``heads``).

    Split by contiguous heads, rank ``r``'s query heads then use exactly its own K/V heads. With
    ``tp > kv_heads`` a rank would hold part of a K/V head: Megatron and vLLM then replicate the K/V
    heads instead (each rank keeps whole ones); this course refuses it.
    """
    if kv_heads % tp:
        raise ValueError(f"tensor parallelism over {tp} ranks needs tp | n_kv_heads, but there are {kv_heads} "
                         f"K/V heads ({heads} query heads): use a tp that divides {kv_heads}, or replicate "
                         "the K/V heads")
    return heads // tp, kv_heads // tp


class SwiGLU(nn.Module):
    """Llama's MLP: ``w2(silu(w1 x) * w3 x)``."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.w1, self.w3 = nn.Linear(dim, hidden, bias=False), nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(nn.functional.silu(self.w1(x)) * self.w3(x))


class LlamaBlock(nn.Module):
    """A pre-norm Llama block (torchtitan's names): RMSNorm, attention, dropout, residual; the same with the MLP.

    Llama has no dropout (``dropout=0.0``, the default); lesson 20 turns it on to show which seed each
    sequence-parallel region needs.
    """

    def __init__(self, dim: int = 16, heads: int = 4, *, kv_heads: int | None = None, hidden: int | None = None,
                 dropout: float = 0.0):
        super().__init__()
        self.attention_norm, self.ffn_norm = nn.RMSNorm(dim), nn.RMSNorm(dim)
        self.attention, self.feed_forward = LlamaAttention(dim, heads, kv_heads), SwiGLU(dim, hidden or 4 * dim)
        self.attention_dropout, self.ffn_dropout = nn.Dropout(dropout), nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention_dropout(self.attention(self.attention_norm(x)))
        return x + self.ffn_dropout(self.feed_forward(self.ffn_norm(x)))


class TinyLlama(nn.Module):
    """Token embedding, ``layers`` Llama blocks, a final RMSNorm and an output head: logits (batch, seq, vocab)."""

    def __init__(self, vocab: int = 32, dim: int = 16, heads: int = 4, layers: int = 1, *, kv_heads: int = 2):
        super().__init__()
        self.tok_embeddings = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(LlamaBlock(dim, heads, kv_heads=kv_heads) for _ in range(layers))
        self.norm, self.output = nn.RMSNorm(dim), nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tok_embeddings(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.output(self.norm(x))
