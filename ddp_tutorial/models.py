"""Models used across the lessons, small enough to train on a 2-core CPU: the one home of models.

``ToyModel`` is the classic DDP example (``07_ddp_spawn``); lessons add their models here so
that every lesson shares one definition. Two registries by name: ``make_model`` for the
data-parallel lessons' models with their (in, out) features, ``build_model`` for the
``--model`` of ``python -m ddp_tutorial.training.train``. ``TinyTransformer`` is the GPT in
miniature that the sharding lessons train on ``token_batch``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn


class ToyModel(nn.Module):
    """Linear(10, 10) -> ReLU -> Linear(10, 5): the model of PyTorch's DDP tutorial."""

    def __init__(self, in_features: int = 10, hidden: int = 10, out_features: int = 5):
        super().__init__()
        self.net1 = nn.Linear(in_features, hidden)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(hidden, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net2(self.relu(self.net1(x)))


class DeepMLP(nn.Module):
    """A stack of Linear + ReLU layers; the defaults hold about 1M parameters (``08_ddp_from_scratch``).

    Many equal layers make many gradients that become ready one after another
    during backward, which is what gradient bucketing works with.
    """

    def __init__(self, in_features: int = 256, hidden: int = 512, depth: int = 4, out_features: int = 10):
        super().__init__()
        sizes = [in_features] + [hidden] * depth + [in_features, out_features]
        layers: list[nn.Module] = []
        for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
            layers.append(nn.Linear(a, b))
            if i < len(sizes) - 2:
                layers.append(nn.ReLU())
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class SharedLayerNet(nn.Module):
    """One Linear used twice per forward, plus BatchNorm buffers (``08_ddp_from_scratch`` tests).

    The shared weight gets two gradient contributions in one backward; the
    BatchNorm running statistics are buffers that DDP keeps equal by broadcast.
    """

    def __init__(self, features: int = 8, out_features: int = 2):
        super().__init__()
        self.shared = nn.Linear(features, features)
        self.norm = nn.BatchNorm1d(features)
        self.head = nn.Linear(features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.shared(x))
        h = torch.tanh(self.shared(self.norm(h)))
        return self.head(h)


def make_model(name: str, seed: int, dtype: torch.dtype = torch.float32) -> tuple[nn.Module, tuple[int, int]]:
    """A model by name and its (in, out) features: ``toy``, ``shared`` (a layer used twice + BatchNorm), ``mlp`` (small), ``big`` (~1M, deep)."""
    torch.manual_seed(seed)
    model, shape = {
        "toy": lambda: (ToyModel(), (10, 5)),
        "shared": lambda: (SharedLayerNet(), (8, 2)),
        "mlp": lambda: (DeepMLP(16, 32, 3, 4), (16, 4)),
        "big": lambda: (DeepMLP(128, 256, 14, 10), (128, 10)),  # 0.92M parameters in 32 tensors
    }[name]()
    return model.to(dtype), shape


# --------------------------------------------------------- lesson 11 (train.py)


class SmallCNN(nn.Module):
    """Two convolutions and two linear layers: the ``--model cnn`` of ``11_train_end_to_end``.

    Reaches about 97% on sklearn's 8x8 digits in seconds on a CPU; the adaptive
    pooling lets the same model take larger images (FakeData 32x32).
    """

    def __init__(self, in_channels: int = 1, num_classes: int = 10, width: int = 16):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, width, 3, padding=1), nn.ReLU(),
            nn.Conv2d(width, 2 * width, 3, padding=1), nn.ReLU(),
            nn.MaxPool2d(2), nn.AdaptiveAvgPool2d(4))
        self.classifier = nn.Sequential(
            nn.Flatten(), nn.Linear(2 * width * 16, 64), nn.ReLU(), nn.Linear(64, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


def resnet18_small(in_channels: int = 3, num_classes: int = 10) -> nn.Module:
    """torchvision's ResNet-18 adapted to 32x32 inputs (CIFAR-10): a 3x3 stem, no max-pool.

    The ImageNet stem (7x7 stride 2, then a max-pool) would shrink a 32x32 image
    to 8x8 before the first block.
    """
    from torchvision.models import resnet18

    model = resnet18(weights=None, num_classes=num_classes)
    model.conv1 = nn.Conv2d(in_channels, 64, kernel_size=3, stride=1, padding=1, bias=False)
    model.maxpool = nn.Identity()
    return model


TRAIN_MODELS = ("cnn", "resnet18")


def build_model(name: str, in_channels: int, num_classes: int) -> nn.Module:
    """The ``--model`` of ``python -m ddp_tutorial.training.train``; unknown names raise ``ValueError``."""
    if name == "cnn":
        return SmallCNN(in_channels, num_classes)
    if name == "resnet18":
        return resnet18_small(in_channels, num_classes)
    raise ValueError(f"unknown model {name!r}; choose one of {', '.join(TRAIN_MODELS)}")


# --------------------------------------------------------- lesson 14 (sharding)


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


# --------------------------------------------------------- lesson 21 (expert parallelism)


class ExpertMLP(nn.Module):
    """One expert of a mixture: Linear(dim, hidden) -> ReLU -> Linear(hidden, dim)."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.up, self.down = nn.Linear(dim, hidden), nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(x)))


class MixtureOfExperts(nn.Module):
    """A top-k routed mixture-of-experts layer, computed in one process (``21_expert_parallel``).

    The router scores each token against every expert (a bias-free linear), softmax makes the
    scores probabilities, each token goes to its ``top_k`` most probable experts, and their
    probabilities, renormalised to sum to 1 (Mixtral's gates), weight the experts' outputs.
    With a ``capacity_factor`` the tokens are cut into ``groups`` equal groups (GShard's groups:
    one per rank under expert parallelism) and in each group an expert takes at most
    ``ceil(factor * group_tokens * top_k / num_experts)`` tokens, first come in token order;
    a token an expert drops gets nothing from it. Written as plain loops: the reference that
    ``expert_parallel.dispatch`` must equal.
    """

    def __init__(self, dim: int = 8, hidden: int = 16, num_experts: int = 4, top_k: int = 2, *,
                 capacity_factor: float | None = None):
        super().__init__()
        self.num_experts, self.top_k, self.capacity_factor = num_experts, top_k, capacity_factor
        self.router = nn.Linear(dim, num_experts, bias=False)
        self.experts = nn.ModuleList(ExpertMLP(dim, hidden) for _ in range(num_experts))

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(probs, chosen, gates)``: every expert's probability (tokens, E), each token's
        ``top_k`` experts (tokens, k) and their renormalised weights (tokens, k)."""
        probs = torch.softmax(self.router(x), dim=-1)
        top, chosen = probs.topk(self.top_k, dim=-1)
        return probs, chosen, top / top.sum(dim=-1, keepdim=True)

    def kept(self, chosen: torch.Tensor, groups: int = 1) -> torch.Tensor:
        """(tokens, k) booleans: which of the choices their expert takes (all, without a capacity)."""
        keep = torch.ones_like(chosen, dtype=torch.bool)
        if self.capacity_factor is None:
            return keep
        per_group = len(chosen) // groups
        limit = math.ceil(self.capacity_factor * per_group * self.top_k / self.num_experts)
        for g in range(groups):
            taken = [0] * self.num_experts
            for t in range(g * per_group, (g + 1) * per_group):
                for slot, e in enumerate(chosen[t].tolist()):
                    keep[t, slot] = taken[e] < limit
                    taken[e] += 1
        return keep

    def forward(self, x: torch.Tensor, groups: int = 1) -> torch.Tensor:
        _, chosen, gates = self.route(x)
        keep = self.kept(chosen, groups)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            token, slot = torch.nonzero((chosen == e) & keep, as_tuple=True)
            if len(token):
                out = out.index_add(0, token, gates[token, slot, None] * expert(x[token]))
        return out


class TinyMoENet(nn.Module):
    """Linear -> residual mixture of experts -> Linear: dense layers around an MoE (``21_expert_parallel``).

    Under expert parallelism ``moe`` is split over ranks and ``inp``/``out`` are data-parallel.
    """

    def __init__(self, dim: int = 8, hidden: int = 16, num_experts: int = 4, top_k: int = 2, *,
                 capacity_factor: float | None = None):
        super().__init__()
        self.inp, self.out = nn.Linear(dim, dim), nn.Linear(dim, dim)
        self.moe = MixtureOfExperts(dim, hidden, num_experts, top_k, capacity_factor=capacity_factor)

    def forward(self, x: torch.Tensor, groups: int = 1) -> torch.Tensor:
        h = self.inp(x)
        return self.out(h + self.moe(h, groups))


# --------------------------------------------------------- lesson 22 (capstone)


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


# --------------------------------------------------------- lesson 20 (long sequences)


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
