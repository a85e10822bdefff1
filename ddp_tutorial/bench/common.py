"""What every benchmark shares: the result record, a table printer, and the course's timer (``timing``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ddp_tutorial.timing import timed  # noqa: F401  (the benchmarks' timer is the lessons' one)


@dataclass
class Result:
    """One benchmark's outcome: ``rows`` (a table, a dict per row) and ``ratios`` (the headline numbers)."""

    name: str
    columns: list[str]
    rows: list[dict[str, Any]] = field(default_factory=list)
    ratios: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def __str__(self) -> str:
        parts = [f"== {self.name} ==", format_table(self.columns, self.rows)]
        parts += [f"{key}: {value:.3g}" for key, value in self.ratios.items()]
        parts += self.notes
        return "\n".join(parts)


def format_table(columns: list[str], rows: list[dict[str, Any]]) -> str:
    def cell(value: Any) -> str:
        return f"{value:.4g}" if isinstance(value, float) else str(value)

    cells = [[cell(row.get(c, "")) for c in columns] for row in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.rjust(w) for c, w in zip(columns, widths))]
    lines += ["  ".join(v.rjust(w) for v, w in zip(r, widths)) for r in cells]
    return "\n".join(lines)
