"""Which group does what: each mesh dimension's collectives and bytes per step, and each rank's bytes (``22_capstone``).

``GroupRecorder`` is a ``TorchDispatchMode`` (the mechanism of torch's own ``CommDebugMode``,
which counts collectives but does not say on which group): every collective a rank issues
reaches torch's dispatcher as an operator of ``c10d`` (``torch.distributed``'s calls: FSDP2's
all-gathers and reduce-scatters, the pipeline's and the ring attention's sends and receives) or of ``_c10d_functional``
(DTensor's redistributions: tensor and sequence parallelism). Each names its process group,
by object or by name; the recorder maps the group to the mesh dimension that owns it and counts
``(dimension, operator)``: the calls, and the bytes this rank sends (``wire_bytes``: the
operator's input tensors, ``numel × element_size``, as a bandwidth-optimal ring moves them).
Waits and other bookkeeping operators carry no group and are not counted.

``shard_bytes`` measures what a rank holds from the real shards: each parameter's local piece
(``DTensor.to_local()``), its gradient, and the optimizer's state tensors; ``traffic_worker``
adds the activations the step saves for backward (``rank_memory.saved_bytes``).

    torchrun --nproc-per-node=8 -m ddp_tutorial.capstone.traffic --dp 2 --tp 2 --pp 2
"""

from __future__ import annotations

import argparse
import time
from collections import Counter
from typing import TYPE_CHECKING, Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ddp_tutorial.capstone.layout import Layout

if TYPE_CHECKING:
    from torch import nn
    from torch.distributed.device_mesh import DeviceMesh

__all__ = ["COLLECTIVE_NAMESPACES", "GroupRecorder", "op_kind", "wire_bytes", "shard_bytes", "traffic_worker",
           "traffic_runs", "layout_row", "main"]

# The dispatcher namespaces of collectives: torch.distributed's calls, and the functional
# collectives DTensor uses (their Python-side aliases included).
COLLECTIVE_NAMESPACES = ("c10d", "_c10d_functional", "c10d_functional", "_c10d_functional_autograd")

# One word per kind of collective, whichever API issued it (FSDP2's "_allgather_base_" and
# DTensor's "all_gather_into_tensor" both gather).
_KINDS = {"allgather": "all_gather", "all_gather": "all_gather", "reduce_scatter": "reduce_scatter",
          "allreduce": "all_reduce", "all_reduce": "all_reduce", "alltoall": "all_to_all",
          "all_to_all": "all_to_all", "broadcast": "broadcast", "send": "send", "recv": "recv",
          "barrier": "barrier", "gather": "gather", "scatter": "scatter", "reduce": "reduce"}


def op_kind(op_name: str) -> str | None:
    """The collective an operator name (``"c10d::_allgather_base_"``) runs, or ``None`` if none."""
    namespace, _, name = op_name.partition("::")
    if namespace not in COLLECTIVE_NAMESPACES:
        return None
    plain = name.split(".")[0].strip("_")
    for prefix, kind in _KINDS.items():  # in _KINDS' order: reduce_scatter before reduce, allgather before gather
        if plain.startswith(prefix):
            return kind
    return None


def wire_bytes(kind: str, nbytes: int, ranks: int) -> int:
    """Bytes one rank sends for a collective of ``kind`` whose input is ``nbytes``, over ``ranks``
    ranks, as a bandwidth-optimal ring moves them (the model of nccl-tests' bus bandwidth):
    an all-gather sends its shard to the ``n - 1`` others, a reduce-scatter ``(n - 1)/n`` of its
    input, an all-reduce both, a send its tensor; a receive sends nothing (its sender counts it)."""
    n = ranks
    factor = {"all_gather": (n - 1, 1), "reduce_scatter": (n - 1, n), "all_reduce": (2 * (n - 1), n),
              "all_to_all": (n - 1, n), "recv": (0, 1)}.get(kind, (1, 1))
    return nbytes * factor[0] // factor[1]


def _group_name(arg: Any) -> str | None:
    """The name of the process group an operator argument stands for, or ``None``.

    Functional collectives pass the group's name (a ``str``); ``c10d`` operators pass the group
    boxed as a ``torch.ScriptObject``, which ``ProcessGroup.unbox`` opens.
    """
    import torch.distributed as dist

    if isinstance(arg, str):
        return arg
    if isinstance(arg, torch.ScriptObject) and "ProcessGroup" in str(arg._type()):
        return dist.ProcessGroup.unbox(arg).group_name
    return None


def _group_size(name: str) -> int:
    from torch.distributed.distributed_c10d import _resolve_process_group  # no public name->group

    return _resolve_process_group(name).size()


def _input_bytes(func: Any, args: tuple, kwargs: dict) -> int:
    """Bytes of the tensors an operator reads (every tensor argument not named ``output...``)."""
    total = 0
    for spec, value in zip(func._schema.arguments, list(args) + [kwargs.get(a.name) for a in
                                                               func._schema.arguments[len(args):]]):
        if spec.name.startswith("output"):
            continue
        for t in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(t, torch.Tensor):
                total += t.numel() * t.element_size()
    return total


class GroupRecorder(TorchDispatchMode):
    """Counts the collectives issued while active, by mesh dimension: ``counts[(dim, kind)]`` calls,
    ``sent[(dim, kind)]`` bytes this rank sends (``wire_bytes``).

    ``groups`` maps a process group's name to a label (``dims_of(mesh)``); a collective on a
    group it does not know is counted under ``"other"``, so that nothing is lost silently.
    """

    def __init__(self, groups: dict[str, str]):
        super().__init__()
        self.groups = groups
        self.counts: Counter = Counter()
        self.sent: Counter = Counter()

    @staticmethod
    def dims_of(mesh: DeviceMesh) -> dict[str, str]:
        """Each mesh dimension's process-group name -> the dimension's name."""
        return {mesh[d].get_group().group_name: d for d in mesh.mesh_dim_names}

    def label(self, name: str) -> str:
        """The dimension of the group called ``name``; a group of the same ranks counts as the same.

        A second mesh over the same ranks may hand DTensor a group created for an earlier one
        (torch reuses groups of equal ranks), whose name this mesh does not list.
        """
        if name not in self.groups:
            import torch.distributed as dist
            from torch.distributed.distributed_c10d import _resolve_process_group  # no public name->group

            ranks = dist.get_process_group_ranks(_resolve_process_group(name))
            # A set: groups already resolved here are listed under their dimension too (a run of
            # many layouts can meet two stale groups of one dimension's ranks).
            same = {d for n, d in self.groups.items()
                    if d != "other" and dist.get_process_group_ranks(_resolve_process_group(n)) == ranks}
            self.groups[name] = same.pop() if len(ranks) > 1 and len(same) == 1 else "other"
        return self.groups[name]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kind = op_kind(func._schema.name)
        if kind is not None:
            values = list(args) + list((kwargs or {}).values())
            names = [n for n in map(_group_name, values) if n is not None]
            # The group comes last: a functional collective's reduce op ("sum") is a string before it.
            key = (self.label(names[-1]) if names else "other", kind)
            self.counts[key] += 1
            ranks = _group_size(names[-1]) if names else 1
            self.sent[key] += wire_bytes(kind, _input_bytes(func, args, kwargs or {}), ranks)
        return func(*args, **(kwargs or {}))


def shard_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """Bytes this rank holds of parameters, gradients and optimizer state: its local shards only."""
    from torch.distributed.tensor import DTensor

    def local(t: torch.Tensor) -> torch.Tensor:
        return t.to_local() if isinstance(t, DTensor) else t

    def size(t: torch.Tensor) -> int:
        return local(t).numel() * t.element_size()

    params = [p for group in optimizer.param_groups for p in group["params"]]
    return {"parameters": sum(size(p) for p in model.parameters()),
            "gradients": sum(size(p.grad) for p in params if p.grad is not None),
            "optimizer": sum(size(v) for p in params for v in optimizer.state.get(p, {}).values()
                             if isinstance(v, torch.Tensor))}


def traffic_worker(rank: int, world_size: int, layout: dict, run: dict | None = None) -> dict:
    """One step of the composed training on ``layout``, recorded: this rank's collectives by mesh
    dimension (calls and bytes sent), after a first step that lets FSDP2 and the pipeline set
    themselves up; the model state it holds, and the activations the step saves for backward."""
    import torch.distributed as dist

    from ddp_tutorial.capstone.composed import build, train_steps
    from ddp_tutorial.capstone.rank_memory import saved_bytes
    from ddp_tutorial.capstone.reference import GPTRun

    parts = build(world_size, layout, GPTRun(**(run or {})))
    train_steps(parts, range(1))  # the first step also initialises (FSDP2's lazy init): not a typical step
    groups = GroupRecorder.dims_of(parts.mesh)
    # FSDP2's group: dp's, cp's, or with both dp x cp flattened, "dp_cp" (torchtitan's dp_shard_cp)
    if parts.fsdp is not None:
        groups.setdefault(parts.fsdp.get_group().group_name, "dp_cp")
    recorder = GroupRecorder(groups)
    dist.barrier()  # every rank starts the timed step together
    start = time.perf_counter()
    with recorder, saved_bytes(parts.model) as saved:
        train_steps(parts, range(1, 2))
    seconds = time.perf_counter() - start  # shown, never asserted: it depends on the machine
    held = shard_bytes(parts.model, parts.optimizer)
    dist.barrier()
    return {"rank": rank, "counts": dict(recorder.counts), "sent": dict(recorder.sent), "bytes": held,
            "activations": saved.total, "seconds": seconds}


def layout_row(layout: dict, ranks: list[dict]) -> dict:
    """One line of the layouts' table from every rank's ``traffic_worker`` result: the most model state
    and the most activations any rank holds, the bytes all ranks send per step and the collectives
    they issue (by dimension), the slowest rank's step."""
    calls: Counter = Counter()
    sent: Counter = Counter()
    for facts in ranks:
        for (dim, _), n in facts["counts"].items():
            calls[dim] += n
        for (dim, _), n in facts["sent"].items():
            sent[dim] += n
    return {"layout": str(Layout(**layout)), "max bytes/rank": max(sum(f["bytes"].values()) for f in ranks),
            "max activations/rank": max(f["activations"] for f in ranks),
            "sent/step": dict(sorted(sent.items())), "collectives/step": dict(sorted(calls.items())),
            "step s": max(f["seconds"] for f in ranks)}


def traffic_runs(rank: int, world_size: int, layouts: list[dict]) -> list[dict]:
    """``traffic_worker`` for each layout in turn, on the same ranks: one launch for several layouts."""
    return [traffic_worker(rank, world_size, layout) for layout in layouts]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for dim in ("dp", "tp", "pp", "cp"):
        parser.add_argument(f"--{dim}", type=int, default=1)
    args = parser.parse_args()
    from ddp_tutorial.env import distributed

    with distributed() as (info, _):
        facts = traffic_worker(info.rank, info.world_size, {"dp": args.dp, "tp": args.tp, "pp": args.pp, "cp": args.cp})
    print(f"rank {info.rank}: " + ", ".join(f"{d} {k} x{n}" for (d, k), n in sorted(facts["counts"].items()))
          + "; bytes " + ", ".join(f"{k} {v}" for k, v in facts["bytes"].items()))


if __name__ == "__main__":
    main()
