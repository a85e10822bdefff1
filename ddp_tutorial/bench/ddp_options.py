"""``bench ddp-options``: torch DDP's own options measured (``13_performance``).

Five ways to run the same torch DDP step of ``DeepMLP`` (0.92M parameters, 2 ranks):

- ``default``: ``DistributedDataParallel(model)``;
- ``fp16 hook`` / ``bf16 hook``: ``register_comm_hook(None, fp16_compress_hook)`` (or bf16):
  each bucket is cast to 16 bits and divided by the world size before the all-reduce, and
  cast back after, so half the bytes cross the wire, at the price of rounding the gradients;
- ``gradient_as_bucket_view``: each ``param.grad`` is a view into its bucket, which saves
  the copy of every gradient into the bucket and back, and the memory of one gradient set;
- ``static_graph``: DDP is told the set of used parameters and the graph never change, so
  after the first iteration it skips that bookkeeping (and it allows reentrant activation
  checkpointing and parameters used several times with ``find_unused_parameters``).

``option_facts`` measures what does not depend on the machine: the bytes each all-reduce
sends (Python-level ``dist.all_reduce`` calls of the hooks, counted), how far each option's
gradients are from the default's, and how many separate storages the gradients live in.
``option_step_times`` times a training step of each; how much each saves depends on the
machine: on 2 CPU cores gloo is bound by copies and core time, so halving the bytes helps
less than on a network link, and the copies ``gradient_as_bucket_view`` saves are small
next to the all-reduce.

    python -m ddp_tutorial.bench ddp-options [--repeat 10] [--plot options.png]
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import gc
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from ddp_tutorial.bench.common import Result
from ddp_tutorial.data_parallel.overlap import rank_batch, stepper
from ddp_tutorial.env import rank_device
from ddp_tutorial.launch import spawn
from ddp_tutorial.models import make_model
from ddp_tutorial.timing import take_turns

if TYPE_CHECKING:  # matplotlib is imported only when a plot is drawn
    from matplotlib.axes import Axes

HELP = "torch DDP's options: fp16/bf16 compression hooks, gradient_as_bucket_view, static_graph (2 ranks)"
OPTIONS = ("default", "fp16 hook", "bf16 hook", "gradient_as_bucket_view", "static_graph")
HOOKS = {"default": default_hooks.allreduce_hook, "fp16 hook": default_hooks.fp16_compress_hook,
         "bf16 hook": default_hooks.bf16_compress_hook}


def wrap_option(option: str, model: nn.Module, *, python_hook: bool = False) -> nn.Module:
    """``model`` in torch DDP with ``option`` (see ``OPTIONS``). ``python_hook`` runs the default's
    all-reduce as ``allreduce_hook``, the same algorithm in Python, so that its bytes can be counted."""
    ddp = nn.parallel.DistributedDataParallel(model, gradient_as_bucket_view=option == "gradient_as_bucket_view",
                                              static_graph=option == "static_graph")
    if option in HOOKS and (option != "default" or python_hook):
        ddp.register_comm_hook(None, HOOKS[option])
    return ddp


@contextlib.contextmanager
def counting_all_reduce() -> Iterator[list[int]]:
    """Within the block, record the bytes of every Python ``dist.all_reduce`` call (the hooks' ones)."""
    sent: list[int] = []
    real = dist.all_reduce

    def counted(tensor, *args, **kwargs):
        sent.append(tensor.numel() * tensor.element_size())
        return real(tensor, *args, **kwargs)

    dist.all_reduce = counted
    try:
        yield sent
    finally:
        dist.all_reduce = real


def option_facts(rank: int, world_size: int, batch_size: int = 32, seed: int = 0) -> dict[str, dict]:
    """Per option, after two steps (DDP rebuilds its buckets after the first): ``bytes`` sent by the
    all-reduces of the second backward, ``grad_error`` (largest ``|grad - default's grad|`` over the largest
    ``|grad|``), ``storages`` (distinct storages holding the gradients) and ``params`` (tensors)."""
    device = rank_device()
    base, (n_in, n_out) = make_model("big", seed)
    x, y = rank_batch(rank, n_in, n_out, batch_size, seed, device)
    grads, out = {}, {}
    for option in OPTIONS:
        ddp = wrap_option(option, copy.deepcopy(base).to(device), python_hook=True)
        for _ in range(2):
            ddp.zero_grad()
            with counting_all_reduce() as sent:
                nn.functional.mse_loss(ddp(x), y).backward()
        params = list(ddp.module.parameters())
        grads[option] = torch.cat([p.grad.reshape(-1) for p in params])
        out[option] = {"bytes": sum(sent) if option in HOOKS else None, "params": len(params),
                       "storages": len({p.grad.untyped_storage().data_ptr() for p in params})}
    scale = grads["default"].abs().max().item()
    for option in OPTIONS:
        out[option]["grad_error"] = (grads[option] - grads["default"]).abs().max().item() / scale
    return out


def option_step_times(rank: int, world_size: int, steps: int = 3, repeat: int = 10,
                      batch_size: int = 32, seed: int = 0) -> dict[str, dict[str, float]]:
    """Seconds per training step with each option: ``best`` and ``median`` (the options take turns)."""
    device = rank_device()
    base, (n_in, n_out) = make_model("big", seed)
    x, y = rank_batch(rank, n_in, n_out, batch_size, seed, device)
    steppers = {o: stepper(wrap_option(o, copy.deepcopy(base).to(device)), x, y) for o in OPTIONS}
    result = take_turns(steppers, steps, repeat, device)
    del steppers
    gc.collect()
    return result


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repeat", type=int, default=10, help="timed rounds; the options take turns")
    parser.add_argument("--steps", type=int, default=3, help="steps per option and round")


def run(args: argparse.Namespace) -> Result:
    facts = spawn(option_facts, 2, timeout=300, quiet=True)[0]
    per_rank = spawn(option_step_times, 2, args=(args.steps, args.repeat), timeout=600, quiet=True)
    best = {o: max(r[o]["best"] for r in per_rank) for o in OPTIONS}  # a step ends at the slowest rank
    rows = [{"option": o, "best ms/step": 1e3 * best[o], "best / default": best[o] / best["default"],
             "MB sent/step": "" if facts[o]["bytes"] is None else facts[o]["bytes"] / 2**20,
             "grad error": facts[o]["grad_error"], "grad storages": facts[o]["storages"]} for o in OPTIONS]
    return Result(
        name=f"ddp-options: torch DDP, DeepMLP 0.92M params, 2 ranks ({args.repeat} rounds x {args.steps} steps)",
        columns=["option", "best ms/step", "best / default", "MB sent/step", "grad error", "grad storages"],
        rows=rows,
        ratios={"fp16 hook bytes / default bytes": facts["fp16 hook"]["bytes"] / facts["default"]["bytes"],
                **{f"{o} / default (time)": best[o] / best["default"] for o in OPTIONS[1:]}},
        notes=["grad error: largest |grad - default's| / largest |grad|; MB sent: the hooks' all-reduces",
               "times depend on the machine; bytes, errors and storages do not"],
    )


def plot(result: Result, ax: Axes) -> None:
    ax.bar([r["option"].replace(" ", "\n").replace("_", "_\n") for r in result.rows],
           [r["best ms/step"] for r in result.rows])
    ax.set_ylabel("ms per step (best)")
    ax.set_title("torch DDP options, ~1M params, 2 ranks", fontsize=10)
    ax.tick_params(axis="x", labelsize=7)
