"""Lesson 18's exercises: a ZeRO-3 linear layer (gather for forward, gather again for backward, reduce-scatter),
and a resharding load of a DCP checkpoint (checked in ``checkpoint_loading``).

The reference is one process holding every weight whole: a two-layer tanh network on every
rank's batch, each rank's loss divided by N (the mean DDP trains on). After one backward the
checker compares this rank's ``shard.grad`` with the reference gradient's padded slice ``r``
(which names a sum for a mean, a missing reduce-scatter, a wrong slice or shape) and ``x.grad``
with the reference's. The collectives are recorded by phase: one all-gather per layer in
forward, one all-gather and one reduce-scatter per layer in backward, no all-reduce. What
forward leaves alive is measured before backward runs (``watching.keeping``: every storage an op
creates in forward, by weak reference, and what autograd saves): a full weight still alive then
(saved with ``ctx.save_for_backward``, an attribute of ``ctx``, a copy, a module-level cache)
fails with the bytes, whatever backward does afterwards (a second all-gather whose result is
thrown away included): ZeRO-3 is what a rank does *not* hold between forward and backward.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ddp_tutorial.env import rank_device
from ddp_tutorial.exercises.checks.checkpoint_loading import load_resharded_worker, prepare
from ddp_tutorial.exercises.exercise import Exercise
from ddp_tutorial.exercises.harness import Case, Report, load_function, run_cases
from ddp_tutorial.exercises.tracing import ALL_GATHERS, COLLECTIVES, REDUCE_SCATTERS, Call, original, traced
from ddp_tutorial.exercises.watching import KeptStorages, keeping

SHAPES = ((5, 4), (3, 5))  # 20 and 15 elements: padded over 3 ranks
BATCHES = (2, 3)  # rows per rank


def weights(seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=g, dtype=torch.float64) for shape in SHAPES]


def batch(seed: int, rank: int, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 * seed + rank)
    return (torch.randn(rows, SHAPES[0][1], generator=g, dtype=torch.float64),
            torch.randn(rows, SHAPES[-1][0], generator=g, dtype=torch.float64))


def piece(full: torch.Tensor, rank: int, n: int) -> torch.Tensor:
    s = -(-full.numel() // n)
    padded = torch.zeros(s * n, dtype=full.dtype)
    padded[:full.numel()] = full.reshape(-1)
    return padded[rank * s:(rank + 1) * s]


def kept_weight(kept: KeptStorages, besides: list[torch.Tensor], itemsize: int) -> str | None:
    """A diagnosis when forward left a full weight's bytes alive for backward, the same on every rank."""
    big = kept.alive(besides, at_least=min(out * inp for out, inp in SHAPES) * itemsize)
    every = [None] * dist.get_world_size()
    original("all_gather_object")(every, big)  # one verdict for all: a rank that stops alone would hang the rest
    big = next((b for b in every if b), [])
    if not big:
        return None
    weights = " and ".join(f"{o} x {i} = {o * i * itemsize} B" for o, i in SHAPES)
    how = ("saved for backward (ctx.save_for_backward)" if any(saved for _, saved in big) else
           "kept outside autograd's saved tensors (an attribute of ctx, a copy, a global or module-level cache)")
    return (f"after forward, before any backward, {sum(size for size, _ in big)} B that forward created are still "
            f"alive besides the layers' outputs: the full weights ({weights}) {how}. Between forward and "
            "backward a ZeRO-3 rank holds only its shard (and the input); the full weight must be freed when "
            "forward returns, so every rank's memory is 1/N of the weights, whatever backward does later")


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.allclose(a, b, rtol=1e-9, atol=1e-12)


def reference(seed: int, rows: int, n: int) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
    """One process: the mean gradients of every weight, each rank's own gradients, each rank's ``x.grad``."""
    ws = [w.requires_grad_() for w in weights(seed)]
    own, x_grads = [], []
    for r in range(n):
        x, target = batch(seed, r, rows)
        x.requires_grad_()
        loss = ((torch.tanh(x @ ws[0].t()) @ ws[1].t() - target) ** 2).mean()
        own.append(torch.autograd.grad(loss, ws + [x]))
        x_grads.append(own[-1][-1])
    mean = [sum(g[i] for g in own) / n for i in range(len(ws))]
    return mean, [g[:-1] for g in own], x_grads


def wrong_grad(i: int, got: object, mean: torch.Tensor, own: torch.Tensor, rank: int, n: int) -> str | None:
    want, s = piece(mean, rank, n), -(-mean.numel() // n)
    name = f"layer {i}'s shard.grad"
    if got is None:
        return f"{name} is None: backward must return a gradient for the shard (its second output)"
    if not isinstance(got, torch.Tensor) or got.shape != want.shape:
        shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
        return f"{name} has shape {shape}, expected ({s},): this rank's piece of the padded gradient"
    got = got.detach().cpu()
    if close(got, want):
        return None
    if n > 1 and close(got, want * n):
        return (f"{name} is {n} times the mean: the reduce-scatter sums the ranks' gradients; divide by the "
                "world size")
    if n > 1 and close(got, piece(own, rank, n)):
        return (f"{name} is this rank's own gradient, not the mean over ranks: reduce-scatter the full "
                "gradient (and divide by the world size)")
    for k in range(n):
        if k != rank and close(got, piece(mean, k, n)):
            return f"{name} is piece {k} of the mean gradient, not this rank's piece {rank}"
    return f"{name} differs from one process's mean gradient (piece {rank}) by up to {(got - want).abs().max():.3g}"


def wrong_collectives(calls: list[Call], layers: int, n: int) -> str | None:
    if any(c.kind == "all_reduce" for c in calls):
        return ("the numbers are right, but it all-reduces: every rank would receive the whole summed "
                "gradient of every weight (what ZeRO-3 exists to avoid, and 2 (n - 1) / n of it sent per rank "
                "where a reduce-scatter sends (n - 1) / n). Reduce-scatter it: each rank needs its piece only")
    forward = [c for c in calls if c.phase == "forward" and c.kind in ALL_GATHERS]
    backward = [c for c in calls if c.phase == "backward"]
    gathers = [c for c in backward if c.kind in ALL_GATHERS]
    scatters = [c for c in backward if c.kind in REDUCE_SCATTERS]
    if len(forward) != layers:
        return f"forward made {len(forward)} all-gathers for {layers} layers: one per layer, just before it computes"
    if not gathers:
        return ("backward made no all-gather, yet it had the full weight: it was kept from forward in a form the "
                "checker could not measure, so every rank holds every full weight until backward. Keep only the "
                "input and the shard between forward and backward")
    if len(gathers) != layers or len(scatters) != layers:
        return (f"backward made {len(gathers)} all-gathers and {len(scatters)} reduce-scatters for {layers} layers: "
                "one of each per layer")
    return None


def zero3_linear_worker(rank: int, world_size: int, source: str, function: str, trace_dir: str) -> Report:
    """Each batch size in ``BATCHES``: one forward and backward of a two-layer network against one process."""
    with traced(rank, trace_dir, record=COLLECTIVES) as trace:
        fn = load_function(source, function)
        n, device = world_size, rank_device()

        def case(rows: int, seed: int) -> str | None:
            mean, own, x_grads = reference(seed, rows, n)
            shards = [piece(w, rank, n).clone().to(device).requires_grad_() for w in weights(seed)]
            x, target = (t.to(device) for t in batch(seed, rank, rows))
            x.requires_grad_()
            trace.phase = "forward"
            with keeping() as kept:
                hidden = fn(x, shards[0], SHAPES[0])
                act = torch.tanh(hidden)
                out = fn(act, shards[1], SHAPES[1])
            if not isinstance(out, torch.Tensor) or out.shape != (rows, SHAPES[-1][0]):
                return f"{function} returned {type(out).__name__} of the wrong shape: expected ({rows}, ...)"
            trace.phase = ""  # the checker's own all_gather_object below is not the learner's
            wrong = kept_weight(kept, [x, target, *shards, hidden, act, out], x.element_size())
            if wrong:
                return wrong
            trace.phase = "backward"
            ((out - target) ** 2).mean().backward()
            trace.phase = ""
            for i, shard in enumerate(shards):
                wrong = wrong_grad(i, shard.grad, mean[i], own[rank][i], rank, n)
                if wrong:
                    return wrong
            if x.grad is None or not close(x.grad.detach().cpu(), x_grads[rank]):
                return "x.grad differs from one process's: backward must return the input's gradient through the full W"
            return wrong_collectives(trace.calls, len(SHAPES), n)

        cases: list[Case] = [(f"two layers {SHAPES}, {rows} rows per rank", lambda rows=rows, seed=i: case(rows, seed))
                             for i, rows in enumerate(BATCHES)]
        return run_cases(trace, cases)


EXERCISES = [
    Exercise(
        name="zero3_linear", number="18.1", lesson=18, notebook="18_zero3_and_checkpoints.ipynb",
        title="a ZeRO-3 linear layer: gather for forward, gather again for backward, reduce-scatter", level="hard",
        task=("Write a linear layer whose weight no rank holds whole: all-gather the shards just before the "
              "forward, keep only the shard for backward, gather again in backward, and reduce-scatter the "
              "weight's gradient so each rank gets its piece of the mean."),
        hint=("A torch.autograd.Function gives you both moments: forward (gather, compute, save the input and "
              "the shard, not the full weight) and backward (gather again, then the two matrix products)."),
        more_hints=(
            ("Gather: full = shard.new_empty(shard.numel() * n); all_gather_single(full, shard.detach()); "
             "W = full[:out * in].view(out, in). Backward of y = x @ W.T: grad_x = grad_y @ W, grad_W = "
             "grad_y.T @ x (rows flattened)."),
            ("Reduce-scatter: pad grad_W.reshape(-1) with zeros to shard.numel() * n elements, "
             "reduce_scatter_single(out, padded) with out = torch.empty_like(shard), divide by n, and return "
             "(grad_x, out / n, None) from backward: one gradient per forward input, None for the shape.")),
        checks=("a two-layer tanh network (5 x 4 and 3 x 5 weights: padded over 3 ranks), 2 and 3 rows per "
                "rank, float64; shard.grad against one process's mean gradient (its padded piece r) and x.grad "
                "against one process's; the bytes forward leaves alive (no full weight kept for backward, "
                "saved, on ctx or cached); one all-gather per layer in forward, one all-gather and one "
                "reduce-scatter per layer in backward, no all-reduce"),
        worker=zero3_linear_worker),
    Exercise(
        name="load_resharded", number="18.2", lesson=18, notebook="18_zero3_and_checkpoints.ipynb",
        title="a resharding load: a DCP checkpoint saved on 4 ranks, loaded on 1, 2 and 3", level="medium",
        task=("Load a DCP checkpoint that 4 ranks saved (model and Adam, sharded by FSDP2) into a model and an "
              "optimizer sharded over this world's ranks, so that each rank reads only its own new shards and "
              "no rank ever holds a whole tensor."),
        hint=("Ask the model and the optimizer for their state dicts as they are sharded now, under the keys the "
              "checkpoint was saved with; dcp.load fills them in place; then give them back."),
        more_hints=(
            ("state = {\"model\": get_model_state_dict(model), \"optim\": get_optimizer_state_dict(model, optimizer)}; "
             "dcp.load(state, checkpoint_id=path); then set_model_state_dict(model, state[\"model\"]) and "
             "set_optimizer_state_dict(model, optimizer, state[\"optim\"]) (all from "
             "torch.distributed.checkpoint.state_dict)."),),
        checks=("a TinyTransformer and Adam trained 2 steps and saved on 4 ranks by the course's own code; "
                "loaded on 1, 2 and 3 ranks (on 3, FSDP2's dim-0 shards are uneven: 32 rows as 11, 11, 10) "
                "into a model from another seed and an Adam with another lr, every parameter and Adam "
                "state tensor gathered and compared bit for bit, and the lr; torch.load, dcp.load, the "
                "get_/set_ state-dict functions (with their options) and your own collectives recorded: a single-"
                "file torch.load on every rank, rank 0 loading and broadcasting, weights_only=False or a state "
                "dict never set back fail even with the right numbers"),
        worker=load_resharded_worker, world_sizes=(1, 2, 3), prepare=prepare,
        hang_hint=("a hang: dcp.load and the get_/set_ state-dict functions are collectives, so every rank must "
                   "make the same calls in the same order; a call made on rank 0 only waits forever for the others")),
]
