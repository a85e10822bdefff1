"""Pipeline schedules as orders of actions, simulated and measured (``19_pipeline_schedules``).

A schedule tells each stage in which order to run its micro-batches' forwards (``"F3"``:
the forward of micro-batch 3) and backwards (``"B3"``). Everything here is pure Python,
so it is tested for any number of stages ``p`` and micro-batches ``m``:

- ``gpipe_order`` and ``one_f_one_b_order``: the two classic orders of one stage;
- ``simulate``: run every stage's order on an ideal clock (F takes 1, B takes 2) and return
  the timeline, or raise ``Deadlock`` naming the first step no stage can take;
- ``idle_fraction``, ``peak_in_flight``: the bubble and the activations held, measured on any
  timeline, simulated or recorded from a real run;
- ``bubble_fraction``: the formula ``(p - 1) / (v m + p - 1)``.

An event is ``(rank, stage, kind, micro, start, end)``: ``kind`` is ``"F"``, ``"B"``
(the backward, or its input-gradient half when the schedule splits it) or ``"W"``
(the weight-gradient half).
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["Event", "Deadlock", "gpipe_order", "one_f_one_b_order", "parse_action", "simulate",
           "idle_fraction", "bubble_fraction", "peak_in_flight"]

Event = tuple[int, int, str, int, float, float]


class Deadlock(RuntimeError):
    """No stage can take its next step: each waits for something that never comes."""


def gpipe_order(stage: int, num_stages: int, num_micro: int) -> list[str]:
    """GPipe: every forward, then every backward; the stage holds all ``m`` micro-batches at the turn."""
    return [f"F{i}" for i in range(num_micro)] + [f"B{i}" for i in range(num_micro)]


def one_f_one_b_order(stage: int, num_stages: int, num_micro: int) -> list[str]:
    """1F1B: ``p - 1 - stage`` forwards to fill the pipe, then a forward and a backward in turn,
    then the backwards left. Stage ``s`` never holds more than ``p - s`` micro-batches."""
    warmup = min(num_stages - 1 - stage, num_micro)
    order = [f"F{i}" for i in range(warmup)]
    for i in range(warmup, num_micro):  # steady state: one forward in, one backward out
        order += [f"F{i}", f"B{i - warmup}"]
    order += [f"B{i}" for i in range(num_micro - warmup, num_micro)]
    return order


def parse_action(action: str) -> tuple[str, int]:
    """``"F3"`` -> ``("F", 3)``; anything else raises ``ValueError`` saying what an action looks like."""
    kind, number = action[:1], action[1:]
    if kind not in ("F", "B") or not number.isdigit():
        raise ValueError(f"{action!r} is not an action: write 'F<i>' (forward of micro-batch i) or 'B<i>'")
    return kind, int(number)


def _waits_for(kind: str, micro: int, stage: int, last: int) -> tuple[int, str] | None:
    """The (stage, action) that must be done first: the forward before, the backward after."""
    if kind == "F":
        return (stage - 1, f"F{micro}") if stage > 0 else None
    return (stage + 1, f"B{micro}") if stage < last else (stage, f"F{micro}")


def _stuck(orders: Sequence[Sequence[str]], position: list[int], last: int) -> list[str]:
    lines = []
    for s, order in enumerate(orders):
        if position[s] < len(order):
            kind, micro = parse_action(order[position[s]])
            peer, action = _waits_for(kind, micro, s, last)
            lines.append(f"stage {s} at step {position[s]} ({order[position[s]]}) waits for "
                         + (f"its own {action}, which comes later in its order" if peer == s
                            else f"stage {peer}'s {action}"))
    return lines


def simulate(orders: Sequence[Sequence[str]], durations: dict[str, float] | None = None) -> list[Event]:
    """Run ``orders[s]`` on stage ``s`` (one rank each) with blocking receives, on an ideal clock.

    An action starts when its stage is free and its input has arrived: a forward needs the
    previous stage's forward of the same micro-batch, a backward the next stage's backward
    (the last stage: its own forward). Raises ``Deadlock`` when no stage can move on.
    """
    durations = durations or {"F": 1.0, "B": 2.0}
    last = len(orders) - 1
    done: dict[tuple[int, str], float] = {}  # (stage, action) -> end time
    position, free = [0] * len(orders), [0.0] * len(orders)
    events: list[Event] = []
    while any(position[s] < len(orders[s]) for s in range(len(orders))):
        moved = False
        for s, order in enumerate(orders):
            while position[s] < len(order):
                kind, micro = parse_action(order[position[s]])
                need = _waits_for(kind, micro, s, last)
                if need is not None and need not in done:
                    break
                start = max(free[s], done[need] if need else 0.0)
                free[s] = start + durations[kind]
                done[(s, order[position[s]])] = free[s]
                events.append((s, s, kind, micro, start, free[s]))
                position[s] += 1
                moved = True
        if not moved:
            raise Deadlock("; ".join(_stuck(orders, position, last)))
    return events


def idle_fraction(events: Sequence[Event]) -> float:
    """Share of ranks x wall time spent waiting: the bubble, measured (ranks: those in ``events``)."""
    ranks = {e[0] for e in events}
    span = max(e[5] for e in events) - min(e[4] for e in events)
    busy = sum(e[5] - e[4] for e in events)
    return 1.0 - busy / (len(ranks) * span)


def bubble_fraction(num_stages: int, num_micro: int, virtual: int = 1) -> float:
    """The idle share of a balanced schedule: ``(p - 1) / (v m + p - 1)``.

    Its bubble time over the useful time is ``(p - 1) / (v m)``: GPipe and 1F1B have ``v = 1``,
    interleaved 1F1B with ``v`` stages per rank cuts it ``v`` times.
    """
    return (num_stages - 1) / (virtual * num_micro + num_stages - 1)


def peak_in_flight(events: Sequence[Event], rank: int | None = None) -> int:
    """The most micro-batches whose activations a rank held at once, from a timeline.

    A micro-batch is held by a stage from the end of its forward to the end of its last
    backward piece (``W`` when the backward is split, else ``B``); a rank holding two stages
    counts both.
    """
    split = {(e[1], e[3]) for e in events if e[2] == "W"}
    changes = []
    for r, stage, kind, micro, _, end in events:
        if rank is not None and r != rank:
            continue
        if kind == "F":
            changes.append((end, 1))
        elif kind == "W" or (kind == "B" and (stage, micro) not in split):
            changes.append((end, -1))
    held = peak = 0
    for _, change in sorted(changes, key=lambda c: (c[0], c[1])):  # a release before a new hold
        held += change
        peak = max(peak, held)
    return peak
