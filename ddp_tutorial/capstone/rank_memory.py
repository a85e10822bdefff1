"""Each rank's bytes, measured, beside the memory calculator's prediction (``22_capstone``).

``memory_worker`` runs one training step of the composed capstone (``composed.build``) on a
layout and measures, on every rank:

- parameters, gradients and Adam's two moments from the real local shards after the step
  (``sharding.memory.held``: a ``DTensor``'s ``to_local()``, Adam's 0-dim ``step`` left out as the
  formulas leave it out);
- activations: every storage autograd saves during the step's forwards (``saved_bytes``, a
  ``saved_tensors_hooks`` pack hook); the weights an op saves (FSDP2's gathered ones, TP's
  ``DTensor`` ones) are model state, not activations, and are left out.

``predict`` puts ``sharding.calculator.bytes_per_rank`` beside them for ``CharGPT``'s shape
(``capstone_shape``: no biases, LayerNorm, an untied head). The calculator is exact for
data-parallel ranks (FSDP2 is its ZeRO-3) and an estimate for ``tp`` and ``pp``;
``formula_gap`` names, term by term, what it leaves out for this model: the tests check
measured = predicted + gap to the byte, ``report`` shows the ratio and the largest reasons.
``planning`` applies the same calculator to a real model and cluster. The gaps are stated for CPU ranks (gloo): on CUDA the fused attention kernel torch picks
depends on the GPU and may save other tensors (not measured here).

    python -m ddp_tutorial.capstone.rank_memory --dp 2 --tp 2        # spawns 4 ranks here
    python -m ddp_tutorial.capstone.rank_memory --plan llama3-8b --gpus 64
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from ddp_tutorial.capstone.layout import Layout, coordinates, microbatches_for
from ddp_tutorial.capstone.planning import PLAN_MODELS
from ddp_tutorial.capstone.reference import GPTRun
from ddp_tutorial.sharding.calculator import ModelShape, bytes_per_rank

__all__ = ["TERMS", "SavedBytes", "saved_bytes", "capstone_shape", "micro_batch", "predict", "activation_gap",
           "formula_gap", "top_reasons", "memory_worker", "memory_runs", "report", "main"]

TERMS = ("parameters", "gradients", "optimizer states", "activations")


@dataclass
class SavedBytes:
    """What ``saved_bytes`` counted: bytes of distinct storages saved for backward, and how many."""

    total: int = 0
    storages: int = 0


@contextmanager
def saved_bytes(model: nn.Module) -> Iterator[SavedBytes]:
    """Count every storage autograd saves while the block runs, once, weights of ``model`` excepted."""
    from torch.distributed.tensor import DTensor

    # Each counted storage is kept until the block ends: under 1F1B a microbatch's backward frees its
    # saved tensors before the next forward, whose storages could then reuse their addresses.
    record, seen = SavedBytes(), {}

    def local(t: torch.Tensor) -> torch.Tensor:
        return t.to_local() if isinstance(t, DTensor) else t

    # Where the weights live: (module, name) read afresh at each look, since FSDP2 swaps the
    # Parameter object there; each object's local view kept (with the object), its storage's
    # address read afresh (FSDP2 frees and reallocates the storage behind a gathered weight).
    places = [(m, n) for m in model.modules() for n, _ in m.named_parameters(recurse=False)]
    views: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def weight_addresses() -> set[int]:
        out = set()
        for module, name in places:
            p = getattr(module, name)
            if p is None:
                continue
            if id(p) not in views or views[id(p)][0] is not p:
                views[id(p)] = (p, local(p))
            out.add(views[id(p)][1].untyped_storage().data_ptr())
        return out

    def pack(t: torch.Tensor) -> torch.Tensor:
        if isinstance(t, nn.Parameter):  # a weight (FSDP2's gathered ones are Parameters too): model state
            return t
        # A gather DTensor has not waited for yet is an AsyncCollectiveTensor: its result is ``.elem``.
        storage = getattr(local(t), "elem", local(t)).untyped_storage()
        ptr = storage.data_ptr()
        if ptr in seen or storage.nbytes() == 0:  # counted already, or nothing to count
            return t
        # Read at each new storage, not once: FSDP2 swaps its sharded parameters for gathered ones
        # during the forward, and linear saves the weight as a transposed view, not the Parameter.
        if ptr not in weight_addresses():
            seen[ptr] = storage  # alive until the block ends: an address names one storage
            record.total += storage.nbytes()
            record.storages += 1
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield record


def capstone_shape(run: GPTRun) -> ModelShape:
    """``CharGPT``'s shape for the calculator: no biases in the linears, LayerNorm (weight and bias), untied head."""
    from ddp_tutorial.capstone.chars import VOCAB

    return ModelShape(layers=run.layers, hidden=run.dim, heads=run.heads, vocab=VOCAB, seq=run.seq, bias=False)


def micro_batch(run: GPTRun, layout: Layout) -> int:
    """Sequences in one forward of a rank: its replica's rows, cut into microbatches when pipelined."""
    rows = run.global_batch // layout.dp
    return rows // microbatches_for(layout.pp, run.microbatches) if layout.pp > 1 else rows


def predict(run: GPTRun, layout: Layout) -> dict[str, int]:
    """``bytes_per_rank`` for the capstone's run on ``layout``: FSDP2 is ZeRO-3 over ``dp × cp``, every
    microbatch's activations counted (what the step saves in all; 1F1B frees earlier ones sooner),
    SDPA is a fused kernel (``attention="flash"``), float32 throughout."""
    chunks = microbatches_for(layout.pp, run.microbatches) if layout.pp > 1 else 0
    return bytes_per_rank(capstone_shape(run), micro_batch=micro_batch(run, layout), dp=layout.dp, tp=layout.tp,
                          pp=layout.pp, cp=layout.cp, zero=3 if layout.dp * layout.cp > 1 else 0, precision="fp32",
                          attention="flash", microbatches=chunks)


def _ceil_share(nbytes: int, n: int) -> int:
    return -(-nbytes // n)


def activation_gap(run: GPTRun, layout: Layout, stage: int) -> dict[str, int]:
    """The activation bytes this stage saves beyond the calculator's, by reason (float32, ``cp`` 1).

    The formula divides every term by ``tp``; a term held whole on each tp rank adds ``x - x/tp``.
    """
    if layout.cp > 1:
        raise NotImplementedError("the activation gap for cp is not derived yet (the ring attention's saved blocks)")
    h, e, v, tp = run.dim, 4, capstone_shape(run).vocab, layout.tp
    blocks = run.layers // layout.pp
    tokens = micro_batch(run, layout) * run.seq
    chunks = microbatches_for(layout.pp, run.microbatches) if layout.pp > 1 else 1
    first, last = stage == 0, stage == layout.pp - 1
    th = e * tokens * h
    out = {
        # out.transpose(1, 2).reshape(...) copies (b, heads, s, d) unless a rank holds one head;
        # the formula takes wo's input to be the attention output itself.
        "wo input, a copy": blocks * th // tp if run.heads // tp > 1 else 0,
        "rotary cos, sin": blocks * 4 * run.seq * (h // run.heads // 2) * e,  # for q and k: not per token
        # sequence parallelism gathers the sequence before wq/wk/wv and w1, and linear keeps the gathered input
        "gathered inputs": blocks * 2 * (th - th // tp),
    }
    if last:
        loss = 4 * tokens * v + 4  # float32 log-softmax, the total weight: every tp rank holds the whole logits
        if layout.pp == 1:  # the formula counts the tail, divided by tp
            out["head input, loss (whole)"] = (th - th // tp) + loss - _ceil_share(loss, tp)
        else:  # the formula leaves the tail out on pipelined stages
            out["final norm, head input, loss"] = (th + 2 * 4 * tokens) // tp + th + loss
    out = {k: chunks * b for k, b in out.items()}  # every microbatch's, counted
    out["token ids"] = _token_id_bytes(run, layout, first=first, last=last)
    return out


def _token_id_bytes(run: GPTRun, layout: Layout, *, first: bool, last: bool) -> int:
    """The int64 ids the embedding (inputs) and the loss (targets) keep: copies of a replica's rows, or,
    for one row, views of the step's whole window of ``global_batch x (seq + 1)`` ids (``contiguous()``
    and ``flatten()`` of one row copy nothing), whose storage is then what stays alive, once."""
    replica_rows, rows = run.global_batch // layout.dp, micro_batch(run, layout)
    copies = 8 * replica_rows * run.seq  # composed.train_steps makes the inputs contiguous; the loss flattens targets
    held = (copies if first and replica_rows > 1 else 0) + (copies if last and rows > 1 else 0)
    window = (first and replica_rows == 1) or (last and rows == 1)
    return held + (8 * run.global_batch * (run.seq + 1) if window else 0)


def formula_gap(run: GPTRun, layout: Layout, stage: int) -> dict[str, int]:
    """What the calculator leaves out for ``CharGPT`` on pipeline stage ``stage``, term by term (float32).

    Parameters (and their gradients and moments): under ``tp`` the norms' weights and biases stay
    whole on every rank (``SequenceParallel`` replicates them; the formula divides them by ``tp``);
    under ``pp`` the formula gives the busiest stage half of what lies outside the blocks,
    ``(vocab·h + h) / tp``, where the first holds the embedding, the last the head and the final
    norm, the others neither. Gradients: with ``tp`` and no FSDP2, the embedding's gradient is
    whole (``Replicate``) on every tp rank (FSDP2's reduce-scatter shards it when ``dp·cp > 1``).
    All of it sharded over ``dp × cp``, as FSDP2 and the calculator both shard. Activations:
    ``activation_gap`` (not derived for ``cp > 1``).
    """
    h, e, v, tp = run.dim, 4, capstone_shape(run).vocab, layout.tp
    first, last = stage == 0, stage == layout.pp - 1
    blocks = run.layers // layout.pp
    params = 2 * 2 * h * blocks * (tp - 1) // tp  # two LayerNorms (weight + bias) a block
    if layout.pp == 1:
        params += 2 * h * (tp - 1) // tp  # the final norm
    else:
        params += (v * h // tp if first else 0) + (v * h // tp + 2 * h if last else 0) - (v * h + h) // tp
    shards = layout.dp * layout.cp  # FSDP2's group: the ranks that hold the same weights
    embedding_grad = v * h - v * h // tp if first and shards == 1 else 0
    return {"parameters": params * e // shards, "gradients": (params * e + embedding_grad * e) // shards,
            "optimizer states": 2 * params * e // shards,
            "activations": sum(activation_gap(run, layout, stage).values())}


def memory_worker(rank: int, world_size: int, layout: dict, run: dict | None = None) -> dict:
    """One step of the composed training on ``layout`` in float32 (after a first that sets FSDP2 and the
    pipeline up): this rank's measured bytes by term, the calculator's, and its stage."""
    import torch.distributed as dist

    from ddp_tutorial.capstone.composed import build, train_steps
    from ddp_tutorial.sharding.memory import held

    config = GPTRun(**{"dtype": torch.float32, **(run or {})})
    parts = build(world_size, layout, config)
    train_steps(parts, range(1))  # the first step also initialises (FSDP2's lazy init, the stages' buffers)
    with saved_bytes(parts.model) as saved:
        train_steps(parts, range(1, 2))
    state = held(parts.model.parameters(), parts.optimizer)
    dist.barrier()  # no rank tears the group down under a peer's last collective
    measured = {"parameters": state.params, "gradients": state.grads, "optimizer states": state.optim,
                "activations": saved.total}
    return {"rank": rank, "stage": coordinates(rank, parts.layout)["pp"], "measured": measured,
            "predicted": {t: v for t, v in predict(config, parts.layout).items() if t in TERMS}}


def memory_runs(rank: int, world_size: int, layouts: list[dict], run: dict | None = None) -> list[dict]:
    """``memory_worker`` for each layout in turn, on the same ranks: one launch for several layouts."""
    return [memory_worker(rank, world_size, layout, run) for layout in layouts]


def top_reasons(run: GPTRun, layout: Layout, stage: int, count: int = 2) -> list[str]:
    """The ``count`` largest reasons of ``activation_gap`` for ``stage``, largest first."""
    gap = activation_gap(run, layout, stage)
    return sorted((k for k, v in gap.items() if v > 0), key=gap.get, reverse=True)[:count]


def report(layout: Layout, ranks: list[dict], run: GPTRun) -> list[str]:
    """One line per pipeline stage and term: measured on the stage's first rank, the calculator's
    prediction, their ratio; for activations, the largest reasons the formula leaves out."""
    lines = [f"{layout}: bytes per rank, measured | calculator | measured / calculator (float32)"]
    firsts: dict[int, dict] = {}
    for facts in ranks:
        firsts.setdefault(facts["stage"], facts)
    for facts in firsts.values():
        for term in TERMS:
            got, want = facts["measured"][term], facts["predicted"][term]
            why = f"  ({'; '.join(top_reasons(run, layout, facts['stage']))})" if term == "activations" else ""
            lines.append(f"  stage {facts['stage']} {term:<17} {got:>8} | {want:>8} | {got / want:5.2f}{why}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for dim in ("dp", "tp", "pp"):
        parser.add_argument(f"--{dim}", type=int, default=1)
    parser.add_argument("--plan", default=None, choices=sorted(PLAN_MODELS), help="instead: the layouts that fit this model")
    parser.add_argument("--gpus", type=int, default=64)
    parser.add_argument("--gpu-gib", type=int, default=80)
    parser.add_argument("--seq", type=int, default=None, help="sequence length for --plan (default: the model's)")
    args = parser.parse_args()
    if args.plan:
        from ddp_tutorial.capstone.planning import plan_report

        if args.gpus < 1:
            parser.error(f"--gpus must be at least 1, got {args.gpus}")
        print("\n".join(plan_report(args.plan, gpus=args.gpus, gpu_gib=args.gpu_gib, seq=args.seq)))
        return
    from ddp_tutorial.capstone import rank_memory  # run as __main__, the children must import the worker by its name
    from ddp_tutorial.launch import spawn

    layout, run = Layout(dp=args.dp, tp=args.tp, pp=args.pp), GPTRun(dtype=torch.float32)
    # gloo, so CPU tensors everywhere: the gaps are stated for torch's CPU attention kernel (CUDA picks its
    # fused kernel by GPU and saves other things, e.g. a padded log-sum-exp)
    ranks = spawn(rank_memory.memory_worker, layout.world_size, args=(vars(layout),), backend="gloo", timeout=300)
    print("\n".join(report(layout, ranks, run)))


if __name__ == "__main__":
    main()
