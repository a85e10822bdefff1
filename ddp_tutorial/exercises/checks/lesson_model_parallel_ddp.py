"""Lesson 10's exercise: split ToyModel across two devices, checked against the unsplit model.

The checker builds a ``ToyModel`` (seeded per case), keeps an unsplit copy, runs the
learner's ``split_forward`` on the CPU stand-ins ``("cpu:0", "cpu:1")`` (two names of the one
CPU: what a rank of lesson 10 uses without GPUs), and compares the output and, after the same
loss's ``backward()``, every parameter's gradient with the unsplit model's. On one CPU a
forward that moves nothing gives the same numbers, so the device moves are recorded
(``tracing.moves``): each layer sent to its device, and the input of each layer the result
of a move to that layer's device, as two GPUs would need.
"""

from __future__ import annotations

import copy

import torch

from ddp_tutorial.exercises.exercise import Exercise
from ddp_tutorial.exercises.harness import Case, Report, describe_tensor, load_function, run_cases
from ddp_tutorial.exercises.tracing import COLLECTIVES, MoveRecorder, moves, traced
from ddp_tutorial.models import ToyModel
from ddp_tutorial.pipeline_parallel.model_parallel import toy_batch

DEVICES = ("cpu:0", "cpu:1")  # one CPU under two names: the recorded moves say which device was meant
BATCHES = [4, 1, 7]


def placement(model: ToyModel, moved: MoveRecorder, inputs: dict[str, torch.Tensor]) -> str | None:
    """Each half sent to its device, and its input moved there (``inputs``: what net1, net2 received)."""
    for i, name in enumerate(("net1", "net2")):
        layer, dev = getattr(model, name), DEVICES[i]
        if not moved.sent(list(layer.parameters()), dev):
            return (f"the numbers are right (one CPU computes them anywhere), but model.{name} was never moved to "
                    f"devices[{i}] = {dev!r}: model.{name}.to(devices[{i}]) moves it in place; on two GPUs "
                    "the unmoved half would stay where it was")
        if name not in inputs:
            return (f"model.{name} never ran: call the model's own layers (the checker watches model.net1 and "
                    "model.net2), not copies of them")
        if not moved.moved(inputs[name], dev):
            what = "x" if i == 0 else "the hidden activation relu(net1(x))"
            return (f"the numbers are right (one CPU computes them anywhere), but {what} went into {name} "
                    f"without a move to devices[{i}] = {dev!r}: .to(devices[{i}]) before {name}; on two GPUs "
                    "a tensor on the other device fails there")
    return None


def compare(model: ToyModel, reference: ToyModel, out: object, x: torch.Tensor, y: torch.Tensor,
            function: str) -> str | None:
    """What differs between the split model and the unsplit one (None: nothing)."""
    want = reference(x)
    if not isinstance(out, torch.Tensor):
        return f"{function} returned {type(out).__name__}: return the output tensor of net2"
    if out.shape != want.shape or not torch.allclose(out.detach().cpu(), want.detach(), rtol=1e-12, atol=1e-12):
        relu_skipped = reference.net2(reference.net1(x))
        if out.shape == want.shape and torch.allclose(out.detach().cpu(), relu_skipped.detach(), rtol=1e-12, atol=1e-12):
            return "the output is net2(net1(x)): the relu between the two halves is missing"
        return (f"the output {describe_tensor(out)} (shape {tuple(out.shape)}) is not the unsplit model's "
                f"{describe_tensor(want)} (shape {tuple(want.shape)}): compute net2(relu(net1(x)))")
    if not out.requires_grad:
        return ("the output carries no autograd graph (requires_grad is False): no torch.no_grad() and "
                "no .detach() in the forward pass; backward() must reach both halves")
    ((out - y) ** 2).sum().backward()
    ((want - y) ** 2).sum().backward()
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        if p.grad is None:
            return (f"{name} got no gradient: the graph is cut between the halves (.detach() or .data on "
                    "the hidden activation?); hidden.to(devices[1]) is differentiable and keeps it")
        if not torch.allclose(p.grad.cpu(), q.grad, rtol=1e-12, atol=1e-12):
            return f"{name}'s gradient differs from the unsplit model's: {describe_tensor(p.grad)} vs {describe_tensor(q.grad)}"
    return None


def split_forward_worker(rank: int, world_size: int, source: str, function: str, trace_dir: str) -> Report:
    """Batches of 4, 1 and 7 rows; each rank with its own weights, as its own model-parallel replica."""
    with traced(rank, trace_dir, forbid=COLLECTIVES,
                reason="split_forward runs inside one process: no communication between ranks") as trace:
        fn = load_function(source, function)

        def case(batch: int) -> str | None:
            torch.manual_seed(1000 * rank + batch)
            reference = ToyModel().double()
            model = copy.deepcopy(reference)
            x, y = toy_batch(rank, batch, seed=batch)
            inputs: dict[str, torch.Tensor] = {}
            for name in ("net1", "net2"):
                getattr(model, name).register_forward_pre_hook(
                    lambda _, args, name=name: inputs.setdefault(name, args[0]))
            with moves() as moved:
                out = fn(model, x.clone(), DEVICES)
            return compare(model, reference, out, x, y, function) or placement(model, moved, inputs)

        cases: list[Case] = [(f"a batch of {b} on devices {DEVICES}", lambda b=b: case(b)) for b in BATCHES]
        return run_cases(trace, cases)


EXERCISES = [
    Exercise(
        name="split_forward", number="10.1", lesson=10, notebook="10_model_parallel_ddp.ipynb",
        title="split ToyModel across two devices", level="warm-up",
        task=("Cut a ToyModel in two: net1 on devices[0], net2 on devices[1], and run its forward pass "
              "across the boundary, so that backward() trains both halves exactly like the unsplit model."),
        hint=("model.net1.to(devices[0]) moves the layer in place; x.to(devices[0]) before net1, "
              "hidden.to(devices[1]) before net2; .to() is differentiable. ToyMpModel does the same."),
        checks=("batches of 4, 1 and 7 rows on the CPU stand-ins ('cpu:0', 'cpu:1'), two names of the one "
                "CPU; the output and every parameter's gradient compared with the unsplit ToyModel's "
                "(float64, 1e-12); the device moves recorded: each layer sent to its device, each layer's "
                "input moved to that device"),
        worker=split_forward_worker),
]
