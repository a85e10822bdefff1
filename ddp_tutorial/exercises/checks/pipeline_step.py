"""Lesson 19's second exercise, checked: one 1F1B training step of a stage, with real messages.

Every rank is one stage of ``2 x p`` float64 layers (``one_f_one_b.build_layers``), fresh for
each case; micro-batch counts 1 (fewer than the stages), ``p`` and ``2p + 1``. While the
learner's step runs, the checker watches the stage, never trusting what it returns:

- ``Watch``: a forward pre-hook on the stage numbers its forwards; a ``saved_tensors_hooks`` pair
  tags every tensor autograd saves with that number, keeps a weak reference to it (the
  parameters and the batch itself aside) and marks ``B<i>`` the first time backward unpacks one.
  So the stage's order of forwards and backwards is seen as it ran, and after each forward the
  number of micro-batches whose saved activations are still alive is the number held.
- every send is inspected before it goes (``Trace.on_send``): to a neighbour, of the activation's
  size; at the end the messages are counted per neighbour and direction (one activation and one
  gradient per micro-batch per neighbour). Collectives are refused.
- the gradients are compared with one process on the whole batch (the unsplit model, 1e-12);
  ``m`` times too large and "only the last micro-batch" are named.

A wrong order of blocking calls hangs: the check's timeout names the call and line each rank is stuck at.
The lesson's own 1F1B (``one_f_one_b``, ``orders``) and ``torch.distributed.pipelining`` are refused.
"""

from __future__ import annotations

import weakref

import torch
import torch.distributed as dist
from torch import nn

from ddp_tutorial.env import rank_device
from ddp_tutorial.exercises.harness import Case, Report, load_function, run_cases
from ddp_tutorial.exercises.tracing import COLLECTIVES, P2P, SENDS, Trace, original, traced
from ddp_tutorial.pipeline_parallel.model_parallel import toy_batch
from ddp_tutorial.pipeline_parallel.one_f_one_b import OUT_FEATURES, WIDTH, build_layers, global_grads, stage_module
from ddp_tutorial.pipeline_parallel.orders import one_f_one_b_order

# the lesson's own 1F1B, and torch's schedules (Schedule1F1B would run the whole step for you)
REFUSED = ("ddp_tutorial.pipeline_parallel.orders", "ddp_tutorial.pipeline_parallel.one_f_one_b",
           "ddp_tutorial.pipeline_parallel.torch_schedules", "torch.distributed.pipelining")
ROWS = 2  # rows per micro-batch
TOLERANCE = 1e-12
GPIPE = "GPipe order: all forwards before any backward holds m activations"


class WrongMessage(RuntimeError):
    """A send to a rank that is not a neighbour stage, or of the wrong size."""


class Watch:
    """What one stage does while the learner's step runs: its order of F/B and the micro-batches it holds."""

    def __init__(self, module: nn.Module, *skip: torch.Tensor):
        self.skip = {t.untyped_storage().data_ptr() for t in (*module.parameters(), *skip)}
        self.forwards = 0
        self.events: list[str] = []
        self.refs: dict[int, list[weakref.ref]] = {}
        self.held: list[int] = []  # after each forward: micro-batches with saved activations alive
        module.register_forward_pre_hook(lambda *_: self.begin())
        module.register_forward_hook(lambda *_: self.held.append(self.holding()))

    def begin(self) -> None:
        self.events.append(f"F{self.forwards}")
        self.forwards += 1

    def pack(self, tensor: torch.Tensor) -> tuple[int, torch.Tensor]:
        micro = self.forwards - 1
        if tensor.untyped_storage().data_ptr() in self.skip:
            return micro, tensor
        kept = tensor.detach()  # held by autograd's graph only: freed when the backward frees it
        self.refs.setdefault(micro, []).append(weakref.ref(kept))
        return micro, kept

    def unpack(self, packed: tuple[int, torch.Tensor]) -> torch.Tensor:
        micro, tensor = packed
        if f"B{micro}" not in self.events:
            self.events.append(f"B{micro}")
        return tensor

    def holding(self) -> int:
        return sum(any(r() is not None for r in refs) for refs in self.refs.values())


def check_send(trace: Trace, stage: int, num_stages: int, numel: int) -> None:
    """Before each send: to a neighbour stage, one activation's or gradient's worth of numbers."""
    call = trace.calls[-1]
    neighbours = [s for s in (stage - 1, stage + 1) if 0 <= s < num_stages]
    if call.peer not in neighbours:
        raise WrongMessage(f"stage {stage} of {num_stages} sends to rank {call.peer}, which is not a neighbour stage "
                           f"(stage {stage}'s are {neighbours}): activations go on to stage s + 1, gradients back "
                           "to stage s - 1")
    if call.numel != numel:
        raise WrongMessage(f"stage {stage} sends {call.numel} numbers to stage {call.peer}: an activation or its "
                           f"gradient is {numel} (the shape it was given)")


def messages(trace: Trace, stage: int, num_stages: int, num_micro: int) -> str | None:
    """One activation and one gradient per micro-batch on each link, each way it should go."""
    calls = [c for c in trace.calls if c.kind in P2P]
    for peer, out, back in ((stage + 1, "activations", "gradients"), (stage - 1, "gradients", "activations")):
        if not 0 <= peer < num_stages:
            continue
        sent = sum(c.kind in SENDS and c.peer == peer for c in calls)
        got = sum(c.kind not in SENDS and c.peer == peer for c in calls)
        if (sent, got) != (num_micro, num_micro):
            return (f"stage {stage} sent {sent} messages to stage {peer} and received {got} from it; with {num_micro} "
                    f"micro-batches it sends {num_micro} {out} and receives {num_micro} {back}, one per micro-batch")
    return None


def order_problem(watch: Watch, stage: int, num_stages: int, num_micro: int) -> str | None:
    """The stage's order and peak against 1F1B's."""
    want = one_f_one_b_order(stage, num_stages, num_micro)
    cap, peak = min(num_stages - stage, num_micro), max(watch.held, default=0)
    ran = " ".join(watch.events)
    if all(e.startswith("F") for e in watch.events[:num_micro]) and watch.events != want and peak > cap:
        return (f"{GPIPE}: stage {stage} ran {ran} and held {peak} micro-batches' activations at once; 1F1B holds "
                f"at most min(p - s, m) = {cap}: start the backwards after min(p - 1 - s, m) forwards")
    if peak > cap:
        when = watch.held.index(peak)
        return (f"stage {stage} held {peak} micro-batches' activations at once (after F{when}); 1F1B holds at most "
                f"min(p - s, m) = {cap}: each backward frees its micro-batch's activations, run it sooner")
    if watch.events != want:
        return (f"stage {stage} ran {ran}; 1F1B runs {' '.join(want)}: a warm-up of min(p - 1 - s, m) forwards, "
                "then one forward and one backward in turn, then the backwards left")
    return None


def micro_reference(num_layers: int, x: torch.Tensor, y: torch.Tensor, num_micro: int) -> dict:
    """The unsplit model on the whole batch (the mean loss), and on the last micro-batch alone (its share)."""
    grads = {}
    for label, rows in (("whole", slice(None)), ("last", slice(-ROWS, None))):
        model = nn.Sequential(*build_layers(num_layers))
        loss = nn.functional.mse_loss(model(x[rows]), y[rows]) / (1 if label == "whole" else num_micro)
        loss.backward()
        grads[label] = {n: p.grad for n, p in model.named_parameters()}
        grads[f"{label} loss"] = loss.item()
    return grads


def close(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], scale: float = 1.0) -> bool:
    return all((got[n] - scale * want[n]).abs().max() <= TOLERANCE for n in got)


def gradient_problem(grads: dict[str, torch.Tensor], reference: dict, stage: int, num_micro: int) -> str | None:
    """This stage's gradients against one process's, with the usual ways to get them wrong named."""
    if close(grads, reference["whole"]):
        return None
    if num_micro > 1 and close(grads, reference["whole"], num_micro):
        return (f"stage {stage}'s gradients are {num_micro} times one process's: the loss was not divided by m; "
                "the micro-batches' losses must add up to the whole batch's mean")
    if num_micro > 1 and close(grads, reference["last"]):
        return (f"stage {stage}'s gradients hold the last micro-batch's share only: the gradients were zeroed "
                "between micro-batches; backward adds into .grad, let the micro-batches accumulate")
    name = next(n for n in grads if (grads[n] - reference["whole"][n]).abs().max() > TOLERANCE)
    return f"stage {stage}: the gradient of layer {name} differs from one process's on the whole batch"


def one_f_one_b_step_worker(rank: int, world_size: int, source: str, function: str, trace_dir: str) -> Report:
    """Micro-batch counts 1, p and 2p + 1; this rank is stage ``rank`` of ``world_size``."""
    reason = "a pipeline stage talks to its two neighbours only, by point-to-point messages"
    with traced(rank, trace_dir, forbid=COLLECTIVES, reason=reason) as trace:
        fn = load_function(source, function, refuse=REFUSED)
        device, p = rank_device(), world_size
        first, last = rank == 0, rank == p - 1

        def case(m: int) -> str | None:
            module, first_layer = stage_module(build_layers(2 * p), rank, p)
            module.to(device)
            x, y = toy_batch(0, m * ROWS, 0, WIDTH, OUT_FEATURES)
            xs, ys = x.to(device).split(ROWS), y.to(device).split(ROWS)
            watch = Watch(module, *xs)
            trace.on_send = lambda: check_send(trace, rank, p, ROWS * WIDTH)
            loss_fn = (lambda out, i: nn.functional.mse_loss(out, ys[i])) if last else None
            try:
                with torch.autograd.graph.saved_tensors_hooks(watch.pack, watch.unpack):
                    loss = fn(module, rank, p, num_micro=m, micro_batches=list(xs) if first else None,
                              loss_fn=loss_fn, shape=(ROWS, WIDTH))
            except WrongMessage:
                raise
            except Exception as err:
                if m < p - 1 - rank:  # a warm-up longer than the micro-batches
                    raise uncapped(err, m, p - 1 - rank) from err
                raise
            finally:
                trace.on_send = None
            reference = micro_reference(2 * p, x, y, m)
            missing = [n for n, prm in module.named_parameters() if prm.grad is None]
            grads = None if missing else global_grads(module, first_layer)
            grads_ok = grads is not None and close(grads, reference["whole"])
            # which stages' gradients are right (all_gather_object would go through the refused collectives)
            everyone = [torch.zeros(1, device=device) for _ in range(p)]
            original("all_gather")(everyone, torch.tensor([float(grads_ok)], device=device))
            if missing:
                return f"stage {rank}: parameter {missing[0]} has no gradient: run a backward for each micro-batch"
            problem = messages(trace, rank, p, m) or order_problem(watch, rank, p, m)
            if problem or grads_ok:
                return problem or loss_problem(loss, reference["whole loss"], last)
            if not last and everyone[rank + 1].item():
                return (f"stage {rank}'s gradients differ from one process's while stage {rank + 1}'s are right: what "
                        f"stage {rank + 1} sends back must be the gradient of its input (its .grad after the backward)")
            return gradient_problem(grads, reference, rank, m)

        counts = sorted({1, p, 2 * p + 1})
        cases: list[Case] = [(f"{m} micro-batch{'es' * (m > 1)} on {p} stages", lambda m=m: case(m)) for m in counts]
        report = run_cases(trace, cases)
        dist.barrier()
        return report


def uncapped(err: Exception, num_micro: int, warmup: int) -> Exception:
    """``err`` again, saying what its likely cause is: a warm-up of more forwards than there are micro-batches."""
    note = (f" (with m = {num_micro} micro-batches, fewer than this stage's p - 1 - s = {warmup} warm-up forwards: "
            "cap the warm-up at m, min(p - 1 - s, m))")
    try:
        return type(err)(f"{err}{note}")
    except Exception:  # an exception class that wants other arguments: keep it as it was
        return err


def loss_problem(loss: object, want: float, last: bool) -> str | None:
    """The last stage returns the whole batch's mean loss; the others None."""
    if not last:
        return None if loss is None else f"returned {type(loss).__name__}: a stage before the last returns None"
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        return f"the last stage returned {type(loss).__name__}: return the whole batch's mean loss as a tensor"
    if abs(loss.item() - want) > TOLERANCE:
        return f"the last stage's loss {loss.item():.6g} is not one process's {want:.6g} (the mean over the whole batch)"
    return None

