"""Lesson 18's second exercise, checked: a DCP checkpoint saved on 4 ranks, loaded on 1, 2 and 3 (resharding).

``prepare`` (the parent, once per process) saves the checkpoint with the course's own
``sharded_checkpoint.train_and_save`` on 4 ranks, which returns the full values the ranks held
when they saved; the ``lr`` comes from the checkpoint read another way (``dcp_to_torch_save`` in
one process). Each check copies it. In the ranks, a model built from another seed (sharded
with FSDP2 over this world) and an Adam with another ``lr`` go through the learner's function;
then every parameter and every Adam state tensor is gathered (``full_tensor``) and compared
bit for bit. The library calls are recorded (``recording``): ``torch.load`` (with its
``weights_only``), ``dcp.load``, the ``get_``/``set_`` state-dict functions and their
``StateDictOptions``, and the learner's own collectives (``tracing``), so a load that gets the
numbers right the wrong way (every rank holding the whole model, rank 0 loading and
broadcasting, a state dict never set back) fails with a diagnosis.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from ddp_tutorial.env import rank_device
from ddp_tutorial.exercises.harness import Report, load_function, run_cases
from ddp_tutorial.exercises.recording import LibraryCall, learner_calls, recording
from ddp_tutorial.exercises.tracing import COLLECTIVES, Call, original, traced
from ddp_tutorial.launch import spawn
from ddp_tutorial.models import TinyTransformer
from ddp_tutorial.sharding.fsdp import shard_model
from ddp_tutorial.sharding.sharded_checkpoint import train_and_save

SAVED_ON = 4  # ranks that save; the learner's function loads on 1, 2 and 3 (uneven dim-0 shards: 32 rows as 11, 11, 10)
STATE_DICT = "torch.distributed.checkpoint.state_dict"
TARGETS = {
    "torch.load": ["torch:load"],
    "dcp.load": ["torch.distributed.checkpoint:load", "torch.distributed.checkpoint.state_dict_loader:load"],
    "dcp_to_torch_save": ["torch.distributed.checkpoint.format_utils:dcp_to_torch_save"],
    **{name: [f"{STATE_DICT}:{name}"] for name in ("get_model_state_dict", "get_optimizer_state_dict", "get_state_dict",
                                                    "set_model_state_dict", "set_optimizer_state_dict", "set_state_dict")},
}
BROADCASTS = ("broadcast", "broadcast_object_list", "scatter_object_list", "scatter")
SAVED: dict[str, tuple[str, dict[str, torch.Tensor], float]] = {}  # saved once per process, copied per check


def saved_checkpoint() -> tuple[str, dict[str, torch.Tensor], float]:
    """``(folder, full values, lr)`` of a checkpoint saved on ``SAVED_ON`` ranks (once per process)."""
    if not SAVED:
        from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

        folder = tempfile.mkdtemp(prefix="ddp_tutorial_dcp_")
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        path = os.path.join(folder, "checkpoint")
        values = spawn(train_and_save, SAVED_ON, args=(path,), timeout=120, quiet=True)[0]
        export = os.path.join(folder, "one.pt")
        dcp_to_torch_save(path, export)  # one process, no group: the lr as the files hold it
        lr = torch.load(export, weights_only=True)["optim"]["param_groups"][0]["lr"]
        os.remove(export)
        SAVED["checkpoint"] = (path, values, lr)
    return SAVED["checkpoint"]


def prepare(folder: str) -> tuple[str, dict[str, torch.Tensor], float]:
    """The checker's inputs: a fresh copy of the checkpoint (a load must not depend on what
    another check left in it), the saved values and lr."""
    path, values, lr = saved_checkpoint()
    return shutil.copytree(path, os.path.join(folder, "checkpoint")), values, lr


def full(x: object) -> object:
    """A DTensor gathered (a collective: every rank calls it in the same order), on the CPU."""
    if isinstance(x, DTensor):
        x = x.full_tensor()
    return x.detach().cpu() if isinstance(x, torch.Tensor) else x


def loaded(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, object]:
    """Every parameter and Adam state value under the names ``train_and_save`` saved them with."""
    values: dict[str, object] = {}
    for name, p in model.named_parameters():
        values[f"model.{name}"] = full(p)
        for key, value in sorted(optimizer.state.get(p, {}).items()):
            values[f"optim.state.{name}.{key}"] = full(value)
    return values


def layout(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[tuple[str, str]]:
    """What ``loaded`` will gather, by name and kind: it must be the same on every rank."""
    out = []
    for name, p in model.named_parameters():
        out.append((name, type(p).__name__))
        out += [(f"{name}.{key}", type(v).__name__) for key, v in sorted(optimizer.state.get(p, {}).items())]
    return out


def options(call: LibraryCall, flag: str) -> bool:
    """True when the call's ``StateDictOptions`` set ``flag`` (``full_state_dict``, ``broadcast_from_rank0``)."""
    return bool(getattr(call.arguments.get("options"), flag, False))


def called(calls: list[LibraryCall], *names: str) -> bool:
    return any(learner_calls(calls, name) for name in names)


def wrong_numbers(values: dict[str, object], saved: dict[str, torch.Tensor], lr_now: float, lr: float,
                  calls: list[LibraryCall]) -> str | None:
    """The first value that differs from what was saved, and what in the record explains it."""
    set_model = called(calls, "set_model_state_dict", "set_state_dict")
    set_optim = called(calls, "set_optimizer_state_dict", "set_state_dict")
    for key, want in saved.items():
        got = values.get(key)
        if key.startswith("model.") and not (isinstance(got, torch.Tensor) and torch.equal(got, want)):
            why = ("dcp.load filled a state dict that was never set back: call set_model_state_dict(model, "
                   "state['model'])" if not set_model else "the weights must come from the checkpoint")
            return f"parameter {key[6:]} differs from what the {SAVED_ON} ranks saved: {why}"
    if not any(k.startswith("optim.") for k in values):
        return ("Adam has no state after the load: the optimizer was not loaded, so a resumed run would restart "
                "Adam's moments (exp_avg, exp_avg_sq) and its step count from zero. Load "
                "get_optimizer_state_dict(model, optimizer) too, then set_optimizer_state_dict")
    for key, want in saved.items():
        got = values.get(key)
        if key.startswith("optim.") and not (isinstance(got, torch.Tensor) and torch.equal(got, want)):
            what = "is missing" if got is None else "differs from what was saved"
            return (f"Adam's {key.removeprefix('optim.state.')} {what}: the optimizer state was not loaded "
                    "(get_optimizer_state_dict -> dcp.load -> set_optimizer_state_dict)")
    if lr_now != lr:
        why = ("set_optimizer_state_dict was never called: dcp.load fills the state dict's tensors in place, but "
               "the optimizer's hyperparameters (param_groups: lr, betas, ...) are no tensors and reach the "
               "optimizer only through set_optimizer_state_dict" if not set_optim else
               "the optimizer's param_groups must come from the checkpoint")
        return f"Adam's lr is {lr_now:g}, the checkpoint's {lr:g}: {why}"
    return None


def wrong_way(calls: list[LibraryCall], collectives: list[Call], world_size: int) -> str | None:
    """With the numbers right: what in the recorded calls is not a sharded, resharding load."""
    for c in learner_calls(calls, "torch.load"):
        if c.arguments.get("weights_only") is False:
            return ("the numbers are right, but torch.load with weights_only=False unpickles arbitrary objects: "
                    "a checkpoint from anywhere can run its code on every rank. Keep weights_only=True (the "
                    "default), and here load the DCP folder with dcp.load, which needs no pickle for tensors")
    broadcasts = [c.kind for c in collectives if c.kind in BROADCASTS]
    from_rank0 = [c for c in calls if c.name.startswith("set_") and options(c, "broadcast_from_rank0")]
    if broadcasts or from_rank0:
        how = f"dist.{broadcasts[0]}" if broadcasts else f"{from_rank0[0].name}(..., broadcast_from_rank0=True)"
        return (f"the numbers are right, but rank 0 loads the whole model and broadcasts it ({how}): rank 0 holds "
                "every weight and all of Adam's state at once, and sends all of it. With DCP every rank reads "
                "only its own shards from the folder: dcp.load into get_model_state_dict/get_optimizer_state_dict")
    if learner_calls(calls, "torch.load"):
        return (f"the numbers are right, but every rank torch.loads a single-file export: every rank holds the whole "
                f"model (and Adam's state) in memory at once, the very thing sharding avoids (here {world_size} "
                f"rank{'s' if world_size > 1 else ''}, in a real job thousands). dcp.load into the sharded state dicts reads only each rank's "
                "byte ranges of the folder")
    full_dicts = [c.name for c in calls if options(c, "full_state_dict")]
    if full_dicts:
        return (f"the numbers are right, but {full_dicts[0]}(..., StateDictOptions(full_state_dict=True)): "
                "whole tensors on every rank, the very thing sharding avoids. Use the sharded state dicts "
                "(the default options): dcp.load reshards them itself")
    if not called(calls, "dcp.load"):
        return "the numbers are right, but dcp.load was never called: load the checkpoint with dcp.load"
    if not called(calls, "set_model_state_dict", "set_state_dict"):
        return ("the numbers are right, but set_model_state_dict was never called: it works here only because "
                "FSDP2's get_model_state_dict returns the parameters themselves, which dcp.load fills in place; "
                "with other options (cpu_offload=True) or another wrapper it returns copies and the model would "
                "keep its old weights. Set the loaded state dict back: set_model_state_dict(model, state['model'])")
    if collectives:
        return (f"the numbers are right, but your code calls dist.{collectives[0].kind}: a resharding load needs "
                "no collective of yours (dcp.load plans who reads what, and the set_ functions need none)")
    return None


def load_resharded_worker(rank: int, world_size: int, source: str, function: str, trace_dir: str, path: str,
                          saved: dict[str, torch.Tensor], lr: float) -> Report:
    """One case: the learner's function loads the 4-rank checkpoint into this world's FSDP2 model and Adam."""
    with traced(rank, trace_dir, record=COLLECTIVES) as trace, recording(trace, TARGETS) as calls:
        fn = load_function(source, function)

        def case() -> str | None:
            torch.manual_seed(1)  # another seed than the saved run's: every equality is the load's work
            model = shard_model(TinyTransformer().to(rank_device()))
            optimizer = torch.optim.Adam(model.parameters(), lr=lr / 10)  # the checkpoint's lr must win
            trace.phase = "load"
            fn(model, optimizer, path)
            trace.phase = ""
            mine = layout(model, optimizer)
            every = [None] * world_size
            original("all_gather_object")(every, mine)  # gathering needs the same tensors on every rank
            if any(other != mine for other in every):
                return "the ranks hold different parameters or optimizer states after the load: every rank must load"
            wrong = wrong_numbers(loaded(model, optimizer), saved, optimizer.param_groups[0]["lr"], lr, calls)
            dist.barrier()  # FSDP2's and gloo's last collectives before the next case or the exit
            return wrong or wrong_way(calls, [c for c in trace.calls if c.phase == "load"], world_size)

        return run_cases(trace, [(f"saved on {SAVED_ON} ranks, loaded on {world_size}", case)])
