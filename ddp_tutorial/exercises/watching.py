"""Inside a checked rank: instruments that watch what the learner's call holds, allocates and moves.

A checker judges how, not only what (issue 37): two numbers can be equal while one rank
keeps every full weight for backward, builds the whole sequence's scores at once, or sends
every row everywhere. Any checker can use these (the import guard, the fifth of issue 37's
instruments, is ``import_guard``, entered by ``harness.load_function`` for every exercise):

- ``keeping()`` yields a ``KeptStorages``: every storage an op creates meanwhile, by weak
  reference, and which of them autograd saved for backward; ``bytes_alive`` says how many
  bytes of them are still alive at any later point (after forward, at each step), besides
  the tensors the checker itself holds. Exercise 18.1 (a full weight kept from forward to
  backward) uses it.
- ``LargestTensor`` records the largest tensor an op allocates (its bytes, shape and op) and
  the first output a test picks out; 20.1 and 20.2 (``attention_checks.WholeSequence``) use it
  to see a tensor as long as the whole sequence.
- ``routed_counts`` turns a routing (the destination of each row, per source rank) into the rows
  each source sends each rank, and ``wrong_split`` compares the rows a rank received from (or
  sent to) each peer with those, naming the all-gather in disguise (every row of every rank
  everywhere: equal numbers, n times the traffic) and elements that are not whole rows. 21.1
  and 21.2 use them.
- ``wrong_mesh_device`` compares the device type a ``DeviceMesh`` was made with against the one
  this rank's tensors live on (22.1): a mesh made for "cpu" on a GPU machine puts every
  collective of its groups on the wrong device, and nothing fails on a laptop.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

__all__ = ["Allocation", "KeptStorages", "LargestTensor", "bytes_alive", "keeping", "routed_counts", "wrong_mesh_device",
           "wrong_split"]


def op_name(func: object) -> str:
    """``aten.mm.default`` -> ``mm``: the op as a learner knows it."""
    name = str(func)
    return name.split(".")[1] if "." in name else name


def storage_of(tensor: torch.Tensor) -> int | None:
    """The address of ``tensor``'s storage (None: a meta tensor, or one without a storage)."""
    if tensor.is_meta:
        return None
    try:
        return tensor.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):  # a nested or sparse tensor has no single storage
        return None


class KeptStorages(TorchDispatchMode):
    """Every storage an op creates while active, by weak reference; and, with ``saved_tensors_hooks``
    packing through ``pack`` (``keeping`` does both), the storages autograd saves for backward."""

    def __init__(self) -> None:
        super().__init__()
        self.refs: dict[int, StorageWeakRef] = {}
        self.saved: set[int] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001  (torch's protocol)
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and not t.is_meta:
                # the latest storage at an address: an earlier one there was freed before it came
                self.refs[t.untyped_storage().data_ptr()] = StorageWeakRef(t.untyped_storage())
        return out

    def pack(self, tensor: torch.Tensor) -> torch.Tensor:
        self.saved.add(tensor.untyped_storage().data_ptr())
        return tensor

    def alive(self, besides: Iterable[torch.Tensor] = (), *, at_least: int = 1,
              patience: float = 1.0) -> list[tuple[int, bool]]:
        """``(bytes, saved by autograd)`` of each storage of ``at_least`` bytes still alive and not under
        ``besides``. A gloo collective's work object lets go of its tensors a moment after it returns
        (in gloo's own thread): what is still alive after ``patience`` seconds of tries (0: one look) is kept."""
        besides = list(besides)
        for _ in range(max(1, round(patience / 0.01))):  # tries, not a clock: a loaded machine waits longer
            gc.collect()  # what only a reference cycle keeps is not kept for backward
            found = [(size, saved) for size, saved in self.storages(besides) if size >= at_least]
            if not found:
                return []
            time.sleep(0.01)
        return found

    def storages(self, besides: Iterable[torch.Tensor] = ()) -> list[tuple[int, bool]]:
        """``(bytes, saved by autograd)`` of each storage alive now, not under ``besides``."""
        mine = {t.untyped_storage().data_ptr() for t in besides}
        out = []
        for ptr, ref in self.refs.items():
            if ptr and ptr not in mine and not ref.expired():
                size = torch.UntypedStorage._new_with_weak_ptr(ref.cdata).nbytes()  # now: a resize_(0) frees
                if size:
                    out.append((size, ptr in self.saved))
        return out


@contextmanager
def keeping() -> Iterator[KeptStorages]:
    """Watch the storages the block creates and those autograd saves (``KeptStorages``)."""
    kept = KeptStorages()
    with torch.autograd.graph.saved_tensors_hooks(kept.pack, lambda t: t), kept:
        yield kept


def bytes_alive(kept: KeptStorages, besides: Iterable[torch.Tensor] = (), *, at_least: int = 1,
                patience: float = 1.0) -> int:
    """The bytes of the storages ``kept`` saw created that are alive now, besides ``besides``'s (at a
    point the checker chooses: after forward, after each step)."""
    return sum(size for size, _ in kept.alive(besides, at_least=at_least, patience=patience))


@dataclass(frozen=True)
class Allocation:
    """One tensor an op made: the op's name (``mm``, ``cat``), the shape, and its bytes."""

    op: str
    shape: tuple[int, ...]
    nbytes: int


class LargestTensor(TorchDispatchMode):
    """While active: ``largest``, the largest tensor an op allocates (an output that shares no storage with
    the op's inputs: views and in-place results are not allocations), and ``flagged``, the first output,
    view or not, for which ``flag`` holds (None when nothing was)."""

    def __init__(self, flag: Callable[[torch.Tensor], bool] | None = None):
        super().__init__()
        self.flag = flag
        self.largest: Allocation | None = None
        self.flagged: Allocation | None = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001  (torch's protocol)
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        inputs = {storage_of(t) for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        for t in tree_leaves(out):
            if not isinstance(t, torch.Tensor):
                continue
            seen = Allocation(op_name(func), tuple(t.shape), t.numel() * t.element_size())
            if self.flagged is None and self.flag is not None and self.flag(t):
                self.flagged = seen
            new = storage_of(t) is None or storage_of(t) not in inputs
            if new and (self.largest is None or seen.nbytes > self.largest.nbytes):
                self.largest = seen
        return out


def routed_counts(destinations: Sequence[Sequence[int]], world_size: int) -> list[list[int]]:
    """``counts[s][d]``: the rows source rank ``s`` sends rank ``d``, where ``destinations[s]`` lists the
    destination of each of ``s``'s rows (a rank with no row has an empty list)."""
    counts = [[0] * world_size for _ in destinations]
    for s, where in enumerate(destinations):
        for d in where:
            if not 0 <= int(d) < world_size:
                raise ValueError(f"source rank {s} routes a row to rank {int(d)}, outside 0..{world_size - 1}")
            counts[s][int(d)] += 1
    return counts


def wrong_split(rank: int, got: Sequence[int], want: Sequence[int], *, every: Sequence[int] | None = None,
                sent: bool = False, who: str = "", routing: str = "the routing", advice: str = "",
                elements: int | None = None, width: int | None = None) -> str | None:
    """None when rank ``rank`` received ``want[p]`` rows from each peer ``p`` (``sent``: sent to), as ``got``
    says it did, and (given ``elements`` and ``width``) the elements are those rows whole; else one line
    saying what differs. Lists of one compare totals. ``every[p]``: the rows there would be if every row
    of every rank went everywhere (all of peer ``p``'s rows; ``sent``: all of this rank's), the all-gather
    in disguise. ``who`` names what moved the rows ("compute", "dispatch"), ``routing`` the routing, and
    ``advice`` replaces the line's last words for a mismatch that is not the all-gather."""
    got, want = [int(g) for g in got], [int(w) for w in want]
    if len(got) != len(want):
        raise ValueError(f"got has {len(got)} peers and want {len(want)}: one count per peer, or one total each")
    subject = f"rank {rank}'s {who}" if who else f"rank {rank}"
    verb, way = ("sent", "to") if sent else ("received", "from")
    if len(got) > 1:
        what = f"{subject} {verb} {got} rows {way} ranks 0..{len(got) - 1} where {routing} sends {want}"
    else:
        what = f"{subject} {verb} {got[0]} rows where {routing} sends {'' if sent else 'it '}{want[0]}"
    if got != want and every is not None and got == [int(e) for e in every] and sum(got):
        return (f"{what}: every rank's rows went to every rank, an all-gather in disguise (the numbers come out "
                "equal, with n times the traffic and n times the compute); send each row only to its destination")
    if got != want:
        return f"{what}: {advice or 'send each row only to its destination, once'}"
    if elements is not None and width is not None and elements != sum(got) * width:
        return (f"{subject} {verb} {elements} elements for {sum(got)} rows of {width}: each row whole and once, "
                f"{sum(got) * width} elements")
    return None


def wrong_mesh_device(mesh: object, expected: str) -> str | None:
    """None when ``mesh`` (a ``DeviceMesh``) was made for the device type ``expected`` ("cpu", "cuda"), else
    one line naming both: every collective over its groups runs on the device type it was made with."""
    made = getattr(mesh, "device_type", None)
    if made is None:
        return f"{type(mesh).__name__} is not a DeviceMesh: it has no device type"
    if made != expected:
        return (f"the mesh was made for device type {made!r}, but this rank's tensors live on {expected!r}: "
                f"init_device_mesh({expected!r}, ...) (ddp_tutorial.env.rank_device().type), never a type "
                "written in by hand")
    return None
