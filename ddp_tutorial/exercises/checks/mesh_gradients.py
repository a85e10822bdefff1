"""Exercise 15.2 (``lesson_tensor_parallel`` lists it): the gradient all-reduce of a ``dp x tp`` mesh, over ``dp``.

Each rank gets the gradients its piece of ToyModel would have after backward on its ``dp``
row's share of a global batch: computed here, in one process per rank, from the unsplit
model on those rows and cut as section 6 cuts them. The reference is computed another way:
one backward of the unsplit model on the whole global batch, cut the same way. The checker
judges how as well as what: every ``torch.distributed`` collective the learner's code makes
is recorded with its group, its op and the bytes this rank passes, and its group's ranks are
compared with the mesh's own ``dp`` group. Layouts: 2 x 2 named ``("dp", "tp")`` and named
``("tp", "dp")`` (the ``dp`` groups contiguous instead of strided), 1 x 4, 4 x 1, 2 x 1, 1 x 2.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from ddp_tutorial.env import rank_device
from ddp_tutorial.exercises.exercise import Exercise
from ddp_tutorial.exercises.harness import Case, Report, load_function, run_cases
from ddp_tutorial.exercises.recording import LibraryCall, checked_new_group, patched, recording
from ddp_tutorial.exercises.tracing import traced

D_IN, HIDDEN_PER_TP, D_OUT, ROWS_PER_DP = 5, 2, 3, 3
KINDS = ("all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor",
         "broadcast", "reduce", "all_to_all", "all_to_all_single", "all_gather_object")
TARGETS = {k: [f"torch.distributed:{k}", f"torch.distributed.distributed_c10d:{k}"] for k in KINDS}
# (sizes, names in mesh order): the mesh's shape is the sizes in that order
LAYOUTS = {4: [({"dp": 2, "tp": 2}, ("dp", "tp")), ({"dp": 2, "tp": 2}, ("tp", "dp")),
               ({"dp": 1, "tp": 4}, ("dp", "tp")), ({"dp": 4, "tp": 1}, ("dp", "tp"))],
           2: [({"dp": 2, "tp": 1}, ("dp", "tp")), ({"dp": 1, "tp": 2}, ("dp", "tp"))]}


def model_grads(seed: int, hidden: int, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
    """The unsplit ToyModel's gradients of the mean squared error on the rows ``x``, ``y`` (float64)."""
    g = torch.Generator().manual_seed(seed)
    w = {"net1.weight": torch.randn(hidden, D_IN, generator=g, dtype=torch.float64),
         "net1.bias": torch.randn(hidden, generator=g, dtype=torch.float64),
         "net2.weight": torch.randn(D_OUT, hidden, generator=g, dtype=torch.float64),
         "net2.bias": torch.randn(D_OUT, generator=g, dtype=torch.float64)}
    leaves = {k: v.requires_grad_() for k, v in w.items()}
    h = torch.relu(x @ leaves["net1.weight"].T + leaves["net1.bias"])
    out = h @ leaves["net2.weight"].T + leaves["net2.bias"]
    ((out - y) ** 2).mean().backward()
    return {k: v.grad for k, v in leaves.items()}


def cut(grads: dict[str, torch.Tensor], tp_index: int) -> dict[str, torch.Tensor]:
    """Section 6's pieces: net1's rows and net2's columns of tp rank ``tp_index``; net2.bias whole."""
    mine = slice(tp_index * HIDDEN_PER_TP, (tp_index + 1) * HIDDEN_PER_TP)
    return {"net1.weight": grads["net1.weight"][mine].clone(), "net1.bias": grads["net1.bias"][mine].clone(),
            "net2.weight": grads["net2.weight"][:, mine].clone(), "net2.bias": grads["net2.bias"].clone()}


def close(a: Any, b: torch.Tensor) -> bool:
    return isinstance(a, torch.Tensor) and a.shape == b.shape and torch.allclose(
        a.detach().cpu().double(), b, rtol=1e-10, atol=1e-12)


def group_ranks(call: LibraryCall) -> list[int]:
    group = call.arguments.get("group")
    return sorted(dist.get_process_group_ranks(group if group is not None else dist.group.WORLD))


def nbytes(call: LibraryCall, *names: str) -> int:
    """The bytes of a call's tensor arguments called ``names`` (lists of tensors counted whole)."""
    tensors = []
    for value in (call.arguments.get(n) for n in names):
        tensors += value if isinstance(value, (list, tuple)) else [value]
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


SENT = ("tensor", "input_tensor", "input", "input_list")  # what a rank puts in
RECEIVED = ("tensor_list", "output_tensor", "output", "output_list")  # where the others' data lands


def which_group(c: LibraryCall, ranks: list[int], mine: dict[str, list[int]], mesh_groups: list[Any],
                world: int) -> str:
    """How to name the group a call ran over that is not this rank's dp group."""
    group = c.arguments.get("group")
    if group is not None and group is not dist.group.WORLD and all(group is not g for g in mesh_groups):
        which = " (the tp group's ranks)" if ranks == mine["tp"] else ""
        return (f"over a group made by hand with new_group, ranks {ranks}{which}, but this rank's dp group is "
                f"{mine['dp']}: the ranks of a dp group depend on the mesh's order of dimensions (strided "
                "when tp is the inner one); mesh.get_group(\"dp\") is the mesh's own")
    if ranks == list(range(world)):
        return f"over all {world} ranks (the default group), not the dp group {mine['dp']}"
    if ranks == mine["tp"]:
        return f"over the tp group {ranks}, not the dp group {mine['dp']}"
    return f"over ranks {ranks}, but this rank's dp group is {mine['dp']}"


def wrong_traffic(calls: list[LibraryCall], mine: dict[str, list[int]], mesh_groups: list[Any],
                  bias: torch.Tensor, dp: int, world: int, total: int) -> str | None:
    """What is wrong with the collectives: group, op, kind, bytes (None: all-reduces over dp, each value once).

    ``mesh_groups`` are the mesh's own groups (any other but the default was made by hand);
    ``bias`` is the replicated gradient, whose tp copies are equal from the start.
    """
    for c in calls:
        ranks = group_ranks(c)
        if ranks == mine["dp"]:
            continue
        where = which_group(c, ranks, mine, mesh_groups, world)
        if len(mine["tp"]) > 1 and set(mine["tp"]) <= set(ranks) and c.arguments.get("tensor") is bias:
            return (f"dist.{c.name} of net2.bias ran {where}. Its tp copies are already equal (replicated: every tp "
                    f"rank of a row computed the whole of it), so the {nbytes(c, *SENT)} bytes sent over tp "
                    "are for nothing: it is averaged over dp like the shards")
        mixes = (" and adds up the tp ranks' different shards of one weight" if set(mine["tp"]) <= set(ranks)
                 and len(mine["tp"]) > 1 else "")
        return (f"dist.{c.name} ran {where}. It sent {nbytes(c, *SENT)} bytes over ranks that are not the "
                f"data-parallel copies of this rank's pieces{mixes}")
    for c in calls:
        op = c.arguments.get("op", dist.ReduceOp.SUM)
        if c.name == "all_reduce" and op not in (dist.ReduceOp.SUM, dist.ReduceOp.AVG):
            return (f"dist.all_reduce over the dp group used op={op}: an average is the SUM divided by the dp "
                    "group's size, or ReduceOp.AVG")
    others = [c for c in calls if c.name != "all_reduce"]
    if others:
        c = others[0]
        return (f"dist.{c.name} over the dp group {mine['dp']} brought {nbytes(c, *RECEIVED)} bytes into this rank "
                f"for a {nbytes(c, *SENT)}-byte gradient, to average the {dp} copies locally: the right numbers, "
                f"but {dp} times the data received and stored. dist.all_reduce sums in place, each rank ending "
                "with one copy: use dist.all_reduce")
    sent = sum(nbytes(c, *SENT) for c in calls)
    if dp > 1 and calls and sent != total:  # none at all: the values say what is missing
        return (f"the all-reduces over the dp group sent {sent} bytes, but the four gradients hold {total}: "
                "each gradient's values once, no more, no fewer")
    return None


def wrong_values(grads: dict, given: dict[str, torch.Tensor], local: dict[str, torch.Tensor],
                 want: dict[str, torch.Tensor], dp: int, world: int) -> str | None:
    """What is wrong with the averaged gradients (None: each is the whole batch's, in place)."""
    for name, ref in want.items():
        got, tensor = grads.get(name), given[name]
        if got is not tensor:
            if close(got, ref):
                return (f"grads[{name!r}] was replaced by a new tensor: write the average into the tensor given "
                        "(in place, as DDP leaves p.grad), e.g. with in-place ops")
            got = tensor
        if close(tensor, ref):
            continue
        if dp > 1 and close(tensor, ref * dp):
            return (f"{name}'s gradient is {dp} times the whole batch's: the dp copies were summed but not divided "
                    f"by the dp size ({dp}); an average is the sum over the dp group divided by its size")
        if world != dp and close(tensor, ref * dp / world):
            return (f"{name}'s gradient is the sum over dp divided by the world size ({world}), not by the dp size "
                    f"({dp}): average over the ranks that were summed")
        if dp > 1 and close(tensor, local[name]):
            return f"{name}'s gradient is unchanged: it is still this rank's own, not the mean of its dp group"
        diff = (tensor.detach().cpu().double() - ref).abs().max().item() if tensor.shape == ref.shape else None
        return (f"{name}'s gradient is not the whole global batch's, cut to this rank's piece"
                + (f" (off by up to {diff:.3g})" if diff is not None else f" (shape {tuple(tensor.shape)})"))
    return None


def dp_grad_average_worker(rank: int, world_size: int, source: str, function: str, trace_dir: str) -> Report:
    """Each layout of ``LAYOUTS[world_size]``: the recorded collectives, then the values against one process."""
    from torch.distributed.device_mesh import init_device_mesh

    with traced(rank, trace_dir) as trace:
        fn = load_function(source, function, refuse=("ddp_tutorial.tensor_parallel", "ddp_tutorial.capstone"))

        def case(sizes: dict[str, int], names: tuple[str, str], seed: int) -> str | None:
            dp, tp = sizes["dp"], sizes["tp"]
            mesh = init_device_mesh(rank_device().type, tuple(sizes[n] for n in names), mesh_dim_names=names)
            at = dict(zip(names, mesh.get_coordinate()))
            mine = {n: sorted(dist.get_process_group_ranks(mesh.get_group(n))) for n in names}
            g = torch.Generator().manual_seed(1000 + seed)
            x = torch.randn(dp * ROWS_PER_DP, D_IN, generator=g, dtype=torch.float64)
            y = torch.randn(dp * ROWS_PER_DP, D_OUT, generator=g, dtype=torch.float64)
            rows = slice(at["dp"] * ROWS_PER_DP, (at["dp"] + 1) * ROWS_PER_DP)
            local = cut(model_grads(seed, HIDDEN_PER_TP * tp, x[rows], y[rows]), at["tp"])
            want = cut(model_grads(seed, HIDDEN_PER_TP * tp, x, y), at["tp"])  # the whole batch, one backward
            given = {k: v.clone().to(rank_device()) for k, v in local.items()}
            grads = dict(given)
            real = dist.new_group
            with patched([(dist, "new_group", checked_new_group(trace, world_size, real))]), \
                    recording(trace, TARGETS) as recorded:
                try:
                    result = fn(mesh, grads)
                except RuntimeError as err:
                    if "AVG" in str(err):
                        return (f"this backend refuses ReduceOp.AVG ({str(err).splitlines()[0]}): all_reduce with "
                                "SUM, then divide by the dp group's size")
                    raise
            if result is not None:
                return f"{function} returned {type(result).__name__}: it works in place and returns None"
            total = sum(t.numel() * t.element_size() for t in given.values())
            calls = [c for c in recorded if not c.nested]  # not those new_group's comparison made
            wrong = wrong_traffic(calls, mine,
                                  [mesh.get_group(n) for n in names], given["net2.bias"], dp, world_size, total)
            if wrong:
                values = wrong_values(grads, given, local, want, dp, world_size)
                return wrong + (f". And the numbers are wrong: {values}" if values else
                                " (the numbers happen to be right, the traffic is not)")
            wrong = wrong_values(grads, given, local, want, dp, world_size)
            if wrong:
                return wrong
            if dp > 1 and not calls:
                return ("the gradients are right, but no torch.distributed collective was seen: use "
                        "dist.all_reduce(..., group=...) (functional collectives and DTensor are not judged here)")
            return None

        cases: list[Case] = [(f"{sizes['dp']} x {sizes['tp']} (dp x tp) mesh named {names}",
                              lambda s=sizes, n=names, i=i: case(s, n, i))
                             for i, (sizes, names) in enumerate(LAYOUTS[world_size])]
        return run_cases(trace, cases)


DP_GRAD_AVERAGE = Exercise(
    name="dp_grad_average", number="15.2", lesson=15, notebook="15_tensor_parallel.ipynb",
    title="the gradient all-reduce of a dp x tp mesh, over dp only", level="medium",
    task=("On a dp x tp DeviceMesh, each rank holds the gradients of its tensor-parallel pieces of "
          "ToyModel (net1's rows, net2's columns, the replicated net2.bias) computed on its dp share of "
          "the batch. Average them in place into the whole global batch's gradients, communicating only "
          "among the ranks that hold the same pieces."),
    hint=("Two kinds of neighbours on the mesh: the tp ranks of a row hold different pieces of the same "
          "weight and saw the same rows; the dp ranks of a column hold the same piece and saw different "
          "rows. Which of the two does an average of copies concern? And the replicated bias: what do its "
          "tp copies already hold?"),
    more_hints=(
        "A DeviceMesh gives each named dimension its own process group, so a collective can meet the ranks "
        "of one dimension only; the default group is every rank. The mean over k copies is their sum "
        "divided by k, or one reduction op that averages. The replicated bias's tp copies are already "
        "equal: it needs nothing over tp.",
        "For each gradient g, in place: g <- (sum of g over the ranks of this rank's dp group) / (that "
        "group's size). The group is the mesh's, looked up by the name \"dp\" (mesh.get_group takes it), "
        "its size from dist.get_world_size(group); never the default group, never tp, whatever order the "
        "dimensions were named in."),
    checks=("layouts 2 x 2 named (dp, tp) and named (tp, dp), 1 x 4 and 4 x 1 on 4 ranks, 2 x 1 and 1 x 2 "
            "on 2; every torch.distributed collective your code makes is recorded with its group (whose "
            "ranks must be the mesh's dp group), its op and the bytes this rank passes (each gradient's "
            "values once); the values, in the tensors given, against one backward of the unsplit model on "
            "the whole global batch, cut the same way; new_group calls compared across the ranks; "
            "ddp_tutorial.tensor_parallel and ddp_tutorial.capstone are refused"),
    worker=dp_grad_average_worker, world_sizes=(4, 2),
    hang_hint=("a collective over a sub-group meets only that group's ranks, and every rank must call "
               "new_group for every group, in the same order: do all ranks of the group reach the same "
               "collective?"))
