"""Lesson 06's exercise: the ring all-reduce (reduce-scatter, then all-gather).

Rank r's input holds ``10**r + 1000 i`` at flat index i, so the last digits of a (partial)
sum count the ranks' contributions and the thousands tell from which elements they came:
element 3 holding 6101 = 101 + 1000 * (3 + 3) has ranks 0 and 2 added in once, rank 1
never, all from element 3. That is how a wrong chunk is explained. Which phase made it
wrong follows from who finishes it: rank ``c - 1`` completes chunk ``c`` in the
reduce-scatter and the all-gather only copies it on. Each rank copies its finished chunk at
its n-th send, the all-gather's first (a copy at every send: ``Trace.on_send``), the ranks
share whether that copy was the full sum, and a wrong chunk is blamed on the reduce-scatter
when its finisher's copy was already wrong, on the all-gather when it was right.
"""

from __future__ import annotations

import math

import torch

from ddp_tutorial.comm.ring import segment_bounds
from ddp_tutorial.env import rank_device
from ddp_tutorial.exercises.checks.lesson_point_to_point import POINT_TO_POINT_ONLY, neighbours_only
from ddp_tutorial.exercises.exercise import Exercise
from ddp_tutorial.exercises.harness import Case, Report, load_function, returned_in_place, run_cases, same_values
from ddp_tutorial.exercises.tracing import COLLECTIVES, Trace, original, traced

# the typical first, so that a mistake shows on a case that is easy to draw; then the edges
SHAPES = [((6,), torch.float64), ((7,), torch.int64), ((2, 3), torch.float32), ((1,), torch.float64),
          ((2,), torch.float64), ((0,), torch.float64), ((1000,), torch.float64)]


def ring_input(rank: int, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    numel = math.prod(shape)
    return (torch.arange(numel) * 1000 + 10 ** rank).reshape(shape).to(dtype=dtype, device=rank_device())


def decode(value: float, index: int, world_size: int) -> list[int] | None:
    """How many times each rank's input went into element ``index`` (None: not a sum of inputs at ``index``)."""
    if value != int(value) or value < 0:
        return None
    low, high = int(value) % 1000, int(value) // 1000
    counts = [low // 10 ** r % 10 for r in range(world_size)]
    if low >= 10 ** world_size or high != sum(counts) * index:
        return None
    return counts


def contributions(counts: list[int] | None) -> str:
    """What ``decode`` found, in words: "rank 0, rank 2 only (rank 1 missing)"."""
    if counts is None:
        return "a value that is no sum of the inputs at this element (data from other elements)"
    added = [f"rank {r}" if c == 1 else f"rank {r} {c} times" for r, c in enumerate(counts) if c]
    missing = [str(r) for r, c in enumerate(counts) if c == 0]
    if not added:
        return "nothing from any rank"
    gap = f" (rank{'s' if len(missing) > 1 else ''} {', '.join(missing)} missing)" if missing else ""
    return f"{', '.join(added)}{' only' if missing else ''}{gap}"


def phase_of(c: int, world_size: int, finished_right: list[bool]) -> str:
    """Which phase left chunk ``c`` wrong: rank ``c - 1`` finishes chunk ``c`` in the reduce-scatter, and the
    all-gather only copies it on; ``finished_right[k]``: rank k's chunk was the full sum between the phases."""
    return "all-gather" if finished_right[(c - 1) % world_size] else "reduce-scatter"


def wrong_chunk(rank: int, world_size: int, x: torch.Tensor, expected: torch.Tensor,
                finished_right: list[bool], sends: int) -> str:
    """Name the first wrong chunk, what its first wrong element holds, the phase that made it, the likely mistake.

    ``sends``: how many messages this rank sent (fewer than 2 (n - 1): the all-gather is short).
    """
    got, want = x.reshape(-1).double().cpu(), expected.reshape(-1).double().cpu()
    bounds = segment_bounds(got.numel(), world_size)
    right = [c for c, (a, b) in enumerate(bounds) if b > a and torch.equal(got[a:b], want[a:b])]
    c = next(c for c, (a, b) in enumerate(bounds) if b > a and c not in right)
    a, b = bounds[c]
    i = a + int((got[a:b] != want[a:b]).nonzero()[0])
    span = f"element {a}" if b - a == 1 else f"elements {a}..{b - 1}"
    counts = decode(got[i].item(), i, world_size)
    finisher = (c - 1) % world_size
    phase = phase_of(c, world_size, finished_right)
    text = (f"chunk {c} of {world_size} ({span} of {got.numel()}) is wrong: element {i} is {got[i].item():g}, "
            f"expected {want[i].item():g}, the sum over all {world_size} ranks; it holds {contributions(counts)}. "
            f"The {phase} phase made it wrong: ")
    if phase == "reduce-scatter":
        where = "this rank" if finisher == rank else f"rank {finisher}"
        text += f"{where} finishes chunk {c} there, and it was not the full sum. "
        if counts is not None and max(counts) > 1:
            return text + ("A contribution was added twice: is a chunk index off by one? The chunk a rank sends "
                           "in a step is the one it has just added to")
        if counts is not None and 0 in counts:
            return text + ("Contributions are missing: does each step add what arrives into the rank's own copy "
                           "of the chunk (add_, not copy_: overwriting drops what the chunk held), and are all "
                           "n - 1 steps there?")
        if counts is None:
            return text + ("A chunk was received or added at another chunk's place: do sender and receiver of "
                           "each step agree on the chunk index (one off by one?)")
        return text + "A step is missing, or a step sends or fills the wrong chunk."
    text += (f"{'this rank' if finisher == rank else f'rank {finisher}'} finished chunk {c} right, and the "
             f"all-gather did not {'leave it' if finisher == rank else 'bring it here'} intact. ")
    if counts is not None and max(counts) > 1:
        return text + ("It was added on top of the partial sum: the all-gather copies the finished chunk "
                       "(receive straight into it), it does not add.")
    if right == [(rank + 1) % world_size] and sends < 2 * (world_size - 1):
        return text + (f"Only chunk {(rank + 1) % world_size}, the one this rank finishes, is complete: the "
                       "all-gather, which passes every finished chunk once around the ring, is missing or "
                       "stops early.")
    return text + ("A chunk travelled before it was finished, or landed at another chunk's place: in the "
                   "all-gather each rank first sends the chunk it finished, then passes on the one it has just "
                   "received (show('ring_all_reduce', hint=3) has the indices).")


def traffic(trace: Trace, world_size: int, numel: int) -> str | None:
    """A ring sends 2 (n - 1) chunks per rank; sending whole tensors is another algorithm."""
    sent = sum(call.numel for call in trace.calls if call.kind in ("send", "isend"))
    limit = 2 * (world_size - 1) * math.ceil(numel / world_size)
    if sent > limit:
        return (f"the result is right, but it sent {sent} elements for a tensor of {numel} on {world_size} "
                f"ranks; a ring sends one chunk (about numel / n elements) per step, 2 (n - 1) chunks, at "
                f"most {limit} here: send chunks, not the whole tensor")
    return None


def finished_chunk(rank: int, world_size: int, x: torch.Tensor) -> torch.Tensor:
    """The chunk this rank finishes in the reduce-scatter, ``(rank + 1) % n``: a view of ``x``."""
    a, b = segment_bounds(x.numel(), world_size)[(rank + 1) % world_size]
    return x.reshape(-1)[a:b]


def every_rank(flag: bool, world_size: int) -> list[bool]:
    """``flag`` of every rank, in rank order (the checker's own all-gather, on every rank)."""
    mine = torch.tensor([1.0 if flag else 0.0], device=rank_device())
    if world_size == 1:
        return [flag]
    flags = [torch.zeros_like(mine) for _ in range(world_size)]
    original("all_gather")(flags, mine)
    return [bool(f.item()) for f in flags]


def ring_all_reduce_worker(rank: int, world_size: int, source: str, function: str, trace_dir: str) -> Report:
    """Every shape and dtype in ``SHAPES``, compared element by element with ``dist.all_reduce``."""
    with traced(rank, trace_dir, forbid=COLLECTIVES, reason=POINT_TO_POINT_ONLY) as trace:
        fn = load_function(source, function, refuse=("ddp_tutorial.comm.ring",))

        def case(shape: tuple[int, ...], dtype: torch.dtype) -> str | None:
            x = ring_input(rank, shape, dtype)
            expected = x.clone()
            original("all_reduce")(expected)
            # This rank's finished chunk as it was at each send: the n-th send is the all-gather's first
            # (n - 1 reduce-scatter steps before it), so that copy tells the phases apart.
            snapshots: list[torch.Tensor] = []
            trace.on_send = lambda: snapshots.append(finished_chunk(rank, world_size, x).clone())
            result = fn(x)
            trace.on_send = None
            between = snapshots[world_size - 1] if len(snapshots) >= world_size else finished_chunk(rank, world_size, x)
            finished_right = every_rank(torch.equal(between, finished_chunk(rank, world_size, expected)), world_size)
            if not torch.equal(x, expected):
                if result is not x and same_values(result, expected):  # right values, not in place
                    return returned_in_place(function, result, x, expected)
                sends = sum(call.kind in ("send", "isend") for call in trace.calls)
                return wrong_chunk(rank, world_size, x, expected, finished_right, sends)
            return (returned_in_place(function, result, x, expected) or neighbours_only(trace, rank, world_size)
                    or traffic(trace, world_size, x.numel()))

        cases: list[Case] = [(f"numel {math.prod(shape)}, shape {tuple(shape)}, {str(dtype).replace('torch.', '')}",
                              lambda s=shape, d=dtype: case(s, d)) for shape, dtype in SHAPES]
        return run_cases(trace, cases)


EXERCISES = [
    Exercise(
        name="ring_all_reduce", number="6.1", lesson=6, notebook="06_ring_all_reduce.ipynb",
        title="the ring all-reduce: reduce-scatter, then all-gather", level="hard",
        task=("Sum a tensor over all ranks in place with the ring algorithm: n - 1 reduce-scatter steps, "
              "then n - 1 all-gather steps, each rank talking only to its two neighbours; any numel."),
        hint=("Cut the tensor into n chunks. In the reduce-scatter, each step every rank passes one chunk "
              "to its right and adds the chunk arriving from its left into its own copy of that chunk; "
              "after n - 1 steps each rank holds one chunk summed over all ranks. The all-gather passes "
              "those finished chunks once more around the ring, copying instead of adding. Draw n = 3: "
              "which chunk must rank 0 send first so that, n - 1 steps later, one chunk has passed "
              "through every rank?"),
        more_hints=(
            ("chunks = tensor.view(-1).tensor_split(n) gives n views of nearly equal size that every rank "
             "computes alike (some empty when numel < n: sending and receiving an empty chunk is fine, "
             "and so is skipping it on both sides). Reduce-scatter: rank r starts with its own chunk r, "
             "and in step t sends the chunk it has just added to; receive into a scratch buffer, then "
             "add. All-gather: start with the chunk this rank finished, receive straight into the "
             "chunk. Post each step's isend and irecv before waiting on either."),
            ("With right = (rank + 1) % n and left = (rank - 1) % n. Reduce-scatter, t = 0 .. n-2: send "
             "chunk (rank - t) % n to right, receive from left and add it into chunk (rank - t - 1) % n; "
             "afterwards chunk (rank + 1) % n is complete. All-gather, t = 0 .. n-2: send chunk "
             "(rank + 1 - t) % n to right, receive from left into chunk (rank - t) % n.")),
        checks=("numel 6, 7 (uneven chunks), 2-D (2, 3), then 1, 2, 0 (fewer elements than ranks) and 1000; "
                "float64, float32, int64; every element compared with dist.all_reduce, and each input's "
                "digits say which ranks a wrong element holds; reduced in place and returned; messages "
                "only to the right neighbour and from the left; at most 2 (n - 1) chunks sent; "
                "collectives refused"),
        worker=ring_all_reduce_worker),
]
