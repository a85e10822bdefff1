"""A layout (``--dp --tp --pp --cp``) -> one ``DeviceMesh``; which ranks share each group (``22_capstone``).

The ranks form a grid with one dimension per parallelism, in torchtitan's order, outermost
first: ``pp, dp, cp, tp`` (``MESH_DIMS``). Rank ``r``'s coordinates are ``r`` written in
mixed radix with the sizes as digits, the last dimension fastest: neighbouring ranks differ in
``tp``, which talks most (every layer, forward and backward) and belongs inside one node;
``pp`` only sends activations between neighbouring stages and can cross nodes. A *group* of
dimension ``d`` is the ranks whose coordinates agree everywhere but in ``d``: the processes
that run ``d``'s collectives together.

Everything here except ``build_mesh`` is a pure function of the sizes, checked against
torch's ``DeviceMesh`` in the tests and the notebook.

    python -m ddp_tutorial.capstone.layout --dp 2 --tp 2 --pp 2     # the grid and each rank's groups
    python -m ddp_tutorial.capstone.layout --list                   # every layout of up to 8 ranks
"""

from __future__ import annotations

import argparse
import itertools
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, NoReturn

if TYPE_CHECKING:  # torch.distributed is imported by build_mesh, the one function that needs a group
    from torch.distributed.device_mesh import DeviceMesh

__all__ = ["MESH_DIMS", "Layout", "LayoutError", "LayoutParser", "layout_problems", "microbatches_for", "check_layout", "layouts", "coordinates",
           "rank_at", "group_ranks", "all_groups", "build_mesh", "mesh_worker", "describe", "main"]

MESH_DIMS = ("pp", "dp", "cp", "tp")  # torchtitan's order, outermost first: tp varies fastest


@dataclass(frozen=True)
class Layout:
    """How many ranks each parallelism uses; their product is the world size."""

    dp: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1

    @property
    def shape(self) -> tuple[int, ...]:
        """The mesh's shape, in ``MESH_DIMS`` order."""
        return tuple(getattr(self, d) for d in MESH_DIMS)

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    def __str__(self) -> str:
        used = [f"{d}{getattr(self, d)}" for d in ("dp", "tp", "pp", "cp") if getattr(self, d) > 1]
        return " x ".join(used) or "one process"


class LayoutError(ValueError):
    """A layout the world size or the model does not admit; the message lists every reason."""


def layout_problems(layout: Layout, world_size: int | None = None, *, heads: int = 4, layers: int = 4,
                    seq: int = 16, global_batch: int = 8, microbatches: int = 2) -> list[str]:
    """Every reason ``layout`` cannot run ``CharGPT(heads=heads, layers=layers)`` on ``world_size`` ranks
    with batches of ``global_batch`` sequences of ``seq`` characters; ``[]`` when it can."""
    problems = [f"{d}={getattr(layout, d)} must be a positive whole number" for d in MESH_DIMS
                if not isinstance(getattr(layout, d), int) or getattr(layout, d) < 1]
    if problems:
        return problems
    if world_size is not None and layout.world_size != world_size:
        problems.append(f"dp x tp x pp x cp = {layout.world_size}, but the world has {world_size} ranks")
    if heads % layout.tp:
        problems.append(f"tp={layout.tp} does not divide the {heads} attention heads (a rank computes whole heads)")
    if seq % (layout.tp * layout.cp):
        problems.append(f"tp x cp = {layout.tp * layout.cp} does not divide the sequence of {seq} "
                        "(sequence parallelism and context parallelism each cut it)")
    if layers % layout.pp:
        problems.append(f"pp={layout.pp} does not divide the {layers} layers (every stage runs as many)")
    per_replica = global_batch // layout.dp if global_batch % layout.dp == 0 else None
    if per_replica is None:
        problems.append(f"dp={layout.dp} does not divide the global batch of {global_batch} sequences")
    elif layout.pp > 1 and per_replica % microbatches_for(layout.pp, microbatches):
        problems.append(f"a replica's {per_replica} sequences do not split into "
                        f"{microbatches_for(layout.pp, microbatches)} microbatches (at least one per stage)")
    return problems


def microbatches_for(pp: int, microbatches: int) -> int:
    """The microbatches a pipelined replica cuts its rows into: ``microbatches``, and at least one per
    stage (torch refuses fewer for single-stage schedules in some releases, pytorch#144702)."""
    return max(microbatches, pp)


def check_layout(layout: Layout, world_size: int | None = None, **model: int) -> Layout:
    """``layout`` if it admits the world and the model (``layout_problems``), else ``LayoutError``."""
    problems = layout_problems(layout, world_size, **model)
    if problems:
        raise LayoutError(f"layout {layout}: " + "; ".join(problems))
    return layout


def layouts(max_ranks: int = 8, **model: int) -> list[Layout]:
    """Every layout of 1 to ``max_ranks`` ranks that the model admits, by world size, then ``pp, dp, cp, tp``."""
    found = []
    for n in range(1, max_ranks + 1):
        for shape in itertools.product(range(1, n + 1), repeat=len(MESH_DIMS)):
            if math.prod(shape) == n:
                layout = Layout(**dict(zip(MESH_DIMS, shape)))
                if not layout_problems(layout, n, **model):
                    found.append(layout)
    return found


def coordinates(rank: int, layout: Layout) -> dict[str, int]:
    """Rank ``rank``'s index along each mesh dimension: ``rank`` in mixed radix, ``tp`` the last digit."""
    if not 0 <= rank < layout.world_size:
        raise ValueError(f"rank {rank} is not in a world of {layout.world_size}")
    coords = {}
    for dim in reversed(MESH_DIMS):
        rank, coords[dim] = divmod(rank, getattr(layout, dim))
    return {d: coords[d] for d in MESH_DIMS}


def rank_at(coords: dict[str, int], layout: Layout) -> int:
    """The rank at ``coords`` (the inverse of ``coordinates``)."""
    rank = 0
    for dim in MESH_DIMS:
        rank = rank * getattr(layout, dim) + coords[dim]
    return rank


def group_ranks(rank: int, layout: Layout) -> dict[str, list[int]]:
    """For each mesh dimension, the ranks in ``rank``'s group of it: same coordinates but that one."""
    mine = coordinates(rank, layout)
    return {dim: [rank_at({**mine, dim: i}, layout) for i in range(getattr(layout, dim))] for dim in MESH_DIMS}


def all_groups(layout: Layout) -> dict[str, list[list[int]]]:
    """For each mesh dimension, its groups (each a list of ranks), in order of their first rank."""
    out: dict[str, list[list[int]]] = {}
    for dim in MESH_DIMS:
        seen = {tuple(group_ranks(r, layout)[dim]) for r in range(layout.world_size)}
        out[dim] = [list(g) for g in sorted(seen)]
    return out


def build_mesh(layout: Layout) -> DeviceMesh:
    """The layout's ``DeviceMesh`` over every rank of the running group, dimensions named ``MESH_DIMS``.

    A product of sizes other than the world size raises ``LayoutError`` before any collective (the
    model's own limits are ``check_layout``'s). The device type is the one the group's backend serves.
    """
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from ddp_tutorial.env import rank_device

    if layout.world_size != dist.get_world_size():
        raise LayoutError(f"layout {layout}: dp x tp x pp x cp = {layout.world_size}, but the world has "
                          f"{dist.get_world_size()} ranks")
    return init_device_mesh(rank_device().type, layout.shape, mesh_dim_names=MESH_DIMS)


def mesh_worker(rank: int, world_size: int, layouts_: list[dict]) -> list[dict]:
    """For each layout (of ``world_size`` ranks), what torch's ``DeviceMesh`` says of this rank: the
    dimension names, the shape, its coordinate and, per dimension, the ranks of its process group."""
    import torch.distributed as dist

    out = []
    for layout in layouts_:
        mesh = build_mesh(Layout(**layout))
        out.append({"names": mesh.mesh_dim_names, "shape": tuple(mesh.shape),
                    "coordinate": dict(zip(mesh.mesh_dim_names, mesh.get_coordinate())),
                    "groups": {d: dist.get_process_group_ranks(mesh[d].get_group()) for d in mesh.mesh_dim_names}})
    return out


def describe(layout: Layout) -> str:
    """One line per rank: its coordinates and the ranks of each of its groups of more than one."""
    lines = []
    for r in range(layout.world_size):
        coords = " ".join(f"{d}={i}" for d, i in coordinates(r, layout).items())
        groups = "  ".join(f"{d}:{g}" for d, g in group_ranks(r, layout).items() if len(g) > 1)
        lines.append(f"rank {r}: {coords}   {groups or '(alone)'}")
    return "\n".join(lines)


class LayoutParser(argparse.ArgumentParser):
    """The capstone's command lines: torch-free, so ``--help`` answers at once; an error is one line,
    once per node, exit 2 (``launch.errors``: torch loads only then)."""

    def error(self, message: str) -> NoReturn:
        from ddp_tutorial.launch.errors import usage_error

        usage_error(self.prog, message)

    def add_layout_options(self, *, dp_fills: bool) -> None:
        """``--dp --tp --pp --cp``, each at least 1; with ``dp_fills``, ``--dp`` defaults to what the others leave."""
        dp_help = "data-parallel ranks (default: the world size / (tp x pp x cp))" if dp_fills else "(default 1)"
        self.add_argument("--dp", type=int, default=None if dp_fills else 1, help=dp_help)
        for dim, what in (("tp", "tensor-parallel"), ("pp", "pipeline-parallel"), ("cp", "context-parallel")):
            self.add_argument(f"--{dim}", type=int, default=1, help=f"{what} ranks (default 1)")

    def parse_counts(self, argv: list[str] | None = None) -> argparse.Namespace:
        """parse_args, then every number given must be at least 1."""
        args = self.parse_args(argv)
        for option, value in vars(args).items():
            if isinstance(value, int) and not isinstance(value, bool) and value < 1:
                self.error(f"--{option} must be at least 1, got {value}")
        return args


def main() -> None:
    parser = LayoutParser(prog="python -m ddp_tutorial.capstone.layout", description=__doc__.splitlines()[0])
    parser.add_layout_options(dp_fills=False)
    parser.add_argument("--list", action="store_true", help="every layout of up to 8 ranks the model admits")
    args = parser.parse_counts()
    if args.list:
        for layout in layouts():
            print(f"{layout.world_size} ranks: {layout}")
        return
    layout = Layout(args.dp, args.tp, args.pp, args.cp)
    try:
        check_layout(layout)
    except LayoutError as err:
        raise SystemExit(str(err)) from None
    print(f"{layout}: a {' x '.join(map(str, layout.shape))} mesh ({', '.join(MESH_DIMS)})")
    print(describe(layout))


if __name__ == "__main__":
    main()
