"""Pipeline schedules as orders of actions, simulated and measured (``19_pipeline_schedules``).

A schedule tells each stage in which order to run its micro-batches' forwards (``"F3"``:
the forward of micro-batch 3) and backwards (``"B3"``). Everything here is pure Python,
so it is tested for any number of stages ``p`` and micro-batches ``m``:

- ``gpipe_order`` and ``one_f_one_b_order``: the two classic orders of one stage;
- ``simulate``: run every rank's order on an ideal clock (F takes 1, B takes 2, or any
  durations; a rank may hold several stages) and return the timeline, or raise ``Deadlock``
  naming the first step no rank can take;
- ``idle_fraction``, ``peak_in_flight``: the bubble and the activations held, measured on any
  timeline, simulated or recorded from a real run;
- ``bubble_fraction``: the formula ``(p - 1) / (v m + p - 1)``; ``interleaved_peak``: Korthikanti's
  ``p (1 + (p - 1) / (p v))`` micro-batches held on the first rank.

An event is ``(rank, stage, kind, micro, start, end)``: ``kind`` is ``"F"``, ``"B"``
(the backward, or its input-gradient half when the schedule splits it) or ``"W"``
(the weight-gradient half).
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["Event", "Step", "Deadlock", "gpipe_order", "one_f_one_b_order", "parse_action", "as_step", "simulate",
           "idle_fraction", "bubble_fraction", "interleaved_peak", "peak_in_flight"]

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


Step = tuple[int, str, int]  # (stage, kind, micro): one action of a rank that holds several stages


def as_step(action: str | Step, rank: int) -> Step:
    """``"F3"`` on rank ``r`` is stage ``r``'s forward of micro-batch 3; a ``(stage, kind, micro)`` stays."""
    if isinstance(action, str):
        return (rank, *parse_action(action))
    return action


def _waits_for(step: Step, last: int) -> Step | None:
    """The step that must be done first: the forward before, the backward after, W after its own B."""
    stage, kind, micro = step
    kind = "B" if kind == "I" else kind
    if kind == "F":
        return (stage - 1, "F", micro) if stage > 0 else None
    if kind == "W":
        return (stage, "B", micro)
    return (stage + 1, "B", micro) if stage < last else (stage, "F", micro)


def _name(step: Step, one_stage: bool) -> str:
    return f"{step[1]}{step[2]}" if one_stage else f"stage {step[0]}'s {step[1]}{step[2]}"


def _stuck(steps: list[list[Step]], position: list[int], last: int, one_stage: bool) -> list[str]:
    lines, who = [], "stage" if one_stage else "rank"
    for r, order in enumerate(steps):
        if position[r] < len(order):
            need = _waits_for(order[position[r]], last)
            mine = need[0] == r if one_stage else any(st == need for st in order)
            lines.append(f"{who} {r} at step {position[r]} ({_name(order[position[r]], one_stage)}) waits for "
                         + (f"its own {_name(need, True)}, which comes later in its order" if mine
                            else f"stage {need[0]}'s {need[1]}{need[2]}"))
    return lines


def simulate(orders: Sequence[Sequence[str | Step]], durations: dict[str, float] | None = None) -> list[Event]:
    """Run ``orders[r]`` on rank ``r`` with blocking receives, on an ideal clock.

    An action is ``"F3"`` (rank ``r`` is stage ``r``) or ``(stage, kind, micro)`` for a rank that
    holds several stages; kind ``"I"`` is a backward's input half, timed as ``durations["I"]`` and
    recorded as ``"B"``. It starts when its rank is free and its input has arrived: a forward
    needs the previous stage's forward of the same micro-batch, a backward the next stage's
    backward (the last stage: its own forward), a ``W`` its own ``B``. Messages take no time.
    Raises ``Deadlock`` when no rank can move on.
    """
    durations = durations or {"F": 1.0, "B": 2.0}
    steps = [[as_step(a, r) for a in order] for r, order in enumerate(orders)]
    one_stage = all(isinstance(a, str) for order in orders for a in order)
    last = max(st[0] for order in steps for st in order)
    done: dict[Step, float] = {}  # step -> end time
    position, free = [0] * len(steps), [0.0] * len(steps)
    events: list[Event] = []
    while any(position[r] < len(steps[r]) for r in range(len(steps))):
        moved = False
        for r, order in enumerate(steps):
            while position[r] < len(order):
                step = order[position[r]]
                need = _waits_for(step, last)
                if need is not None and need not in done:
                    break
                start = max(free[r], done[need] if need else 0.0)
                free[r] = start + durations[step[1]]
                kind = "B" if step[1] == "I" else step[1]
                done[(step[0], kind, step[2])] = free[r]
                events.append((r, step[0], kind, step[2], start, free[r]))
                position[r] += 1
                moved = True
        if not moved:
            raise Deadlock("; ".join(_stuck(steps, position, last, one_stage)))
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


def interleaved_peak(num_ranks: int, virtual: int = 1) -> float:
    """Micro-batches of a whole rank's activations that interleaved 1F1B keeps on the first rank:
    ``p (1 + (p - 1) / (p v))`` (Korthikanti et al. 2022, section 4.2.3), for ``v >= 2`` stages per
    rank; plain 1F1B holds ``p``."""
    return num_ranks * (1 + (num_ranks - 1) / (num_ranks * virtual))


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
