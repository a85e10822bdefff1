"""The GPT in miniature of the sharding and memory lessons (14, 17, 18): ``Block``, ``TinyTransformer``,
``TinyGPT`` (dropout, math or fused attention) and ``token_batch``, the batches they train on, with
the hand-written layers ZeRO-3 from scratch wraps (``EinsumLinear``, ``LookupMLP``).
"""

from __future__ import annotations

import torch
from torch import nn


class Block(nn.Module):
    """A pre-norm transformer block: causal self-attention, then an MLP, each with a residual.

    ``dropout`` (lesson 17) drops attention probabilities and each branch's output, as GPT-2
    does; 0 (the default) draws no random numbers. ``attention="math"`` computes
    ``softmax(q kᵀ / √d) v`` op by op, so autograd keeps the (seq × seq) matrices that
    ``17_memory`` counts; ``"sdpa"`` (the default) calls ``scaled_dot_product_attention``.
    """

    def __init__(self, dim: int, heads: int, *, dropout: float = 0.0, attention: str = "sdpa"):
        super().__init__()
        if attention not in ("sdpa", "math"):
            raise ValueError(f"attention must be 'sdpa' or 'math', not {attention!r}")
        self.heads, self.dropout, self.attention = heads, dropout, attention
        self.norm1, self.qkv, self.proj = nn.LayerNorm(dim), nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.norm2, self.up, self.down = nn.LayerNorm(dim), nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Causal attention of (batch, heads, seq, head_dim) tensors, with dropout on the probabilities."""
        p = self.dropout if self.training else 0.0
        if self.attention == "sdpa":
            return nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=p)
        t = q.shape[-2]
        # an additive mask: adding saves nothing for backward, masked_fill would keep a mask
        future = torch.full((t, t), float("-inf"), dtype=q.dtype, device=q.device).triu(1)
        scores = (q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5 + future
        probs = scores.softmax(-1)
        return (nn.functional.dropout(probs, p, self.training) if p else probs) @ v

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        def drop(y: torch.Tensor) -> torch.Tensor:  # at p = 0 not even called: today's graph, exactly
            return nn.functional.dropout(y, self.dropout, self.training) if self.dropout else y

        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        attended = self.attend(q, k, v)
        x = x + drop(self.proj(attended.transpose(1, 2).reshape(b, t, d)))
        return x + drop(self.down(nn.functional.gelu(self.up(self.norm2(x)))))


class TinyTransformer(nn.Module):
    """Token embedding, ``layers`` blocks, a final norm and a head: a GPT in miniature.

    Returns logits of shape (batch * seq, vocab). The defaults (7,648 parameters) keep
    every size a multiple of 4, so shards over 1, 2 or 4 ranks are exact.
    """

    def __init__(self, vocab: int = 32, dim: int = 16, heads: int = 2, layers: int = 2):
        super().__init__()
        self.vocab = vocab
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.norm, self.head = nn.LayerNorm(dim), nn.Linear(dim, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x).flatten(0, 1))  # 2-D: the logits are no view of x


def token_batch(step: int, world_size: int, rank: int | None = None, per_rank: int = 4, seq: int = 8,
                vocab: int = 32, device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Step ``step``'s inputs and next-token targets: ``rank``'s share, or the whole global batch (None).

    Every rank draws the same global batch from the step number and keeps its rows, so one
    process can train on exactly what all ranks saw together.
    """
    gen = torch.Generator().manual_seed(1000 + step)
    tokens = torch.randint(0, vocab, (world_size * per_rank, seq + 1), generator=gen)
    if rank is not None:
        tokens = tokens[rank * per_rank:(rank + 1) * per_rank]
    tokens = tokens.to(device)
    return tokens[:, :-1], tokens[:, 1:].reshape(-1)


# --------------------------------------------------------- lesson 17 (memory)


class TinyGPT(TinyTransformer):
    """``TinyTransformer`` with GPT-2's dropout and a choice of attention (``17_memory``).

    ``dropout`` and ``attention`` are ``Block``'s. The blocks are ``TinyTransformer``'s own,
    only switched, so the same seed gives the same weights as ``TinyTransformer``.
    """

    def __init__(self, vocab: int = 32, dim: int = 16, heads: int = 2, layers: int = 2, *, dropout: float = 0.0,
                 attention: str = "sdpa"):
        super().__init__(vocab, dim, heads, layers)
        if attention not in ("sdpa", "math"):
            raise ValueError(f"attention must be 'sdpa' or 'math', not {attention!r}")
        for block in self.blocks:
            block.dropout, block.attention = dropout, attention


# --------------------------------------------------------- lesson 18 (ZeRO-3 from scratch)


class EinsumLinear(nn.Module):
    """A linear layer written by hand: its forward reads ``self.weight`` through ``einsum``, no ``nn.Linear``."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(out_features, in_features) / in_features ** 0.5)
        self.bias = nn.Parameter(torch.zeros(out_features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.einsum("...i,oi->...o", x, self.weight) + self.bias


class LookupMLP(nn.Module):
    """A table indexed by hand (``self.weight[tokens]``, an embedding without ``nn.Embedding``), then two
    ``EinsumLinear``: a model whose sharded weights ``Zero3`` must gather without knowing their layers.
    The 5-row table and 7 outputs are no multiple of 2 or 4 on purpose: the shards need padding."""

    def __init__(self, vocab: int = 5, dim: int = 6, out_features: int = 7):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(vocab, dim))
        self.hidden, self.out = EinsumLinear(dim, 2 * dim), EinsumLinear(2 * dim, out_features)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.hidden(self.weight[tokens])))
