"""The step model's layout and its collectives' alpha-beta costs (issue 39; ``stepmodel`` uses them).

``StepLayout`` says how a step is split; ``ring_bytes`` and ``ring_steps`` give the textbook ring volumes,
``collective_seconds`` their ``alpha + bytes / bandwidth`` cost, ``group_link`` which link a group uses
(NVLink inside one node of ``GPUS_PER_NODE``, the network otherwise).
"""

from __future__ import annotations

from dataclasses import dataclass

from ddp_tutorial.performance.hardware import GPUS_PER_NODE, Hardware

__all__ = ["StepLayout", "ORDER", "CP_KINDS", "ring_bytes", "ring_steps", "group_link", "collective_seconds"]

ORDER = ("tp", "cp", "pp", "dp")  # innermost first: TP on neighbouring GPUs, DP across the cluster
CP_KINDS = ("ring", "ulysses")  # ring attention's K/V passes, or DeepSpeed-Ulysses' all-to-alls


@dataclass(frozen=True)
class StepLayout:
    """How a step is split: degrees of each parallelism, ``zero`` stage 0-3 over DP, ``micro_batches``
    ``m`` of ``micro_batch`` sequences per pipeline per step, ``virtual`` stages per rank (interleaved 1F1B),
    ``grad_bytes`` per gradient value on the wire (2 for bf16, 4 when reduced in fp32), ``value_bytes`` per
    weight and activation value (2 for bf16; 4 or 8 for the course's float32 and float64 runs), ``cp_kind`` how
    context parallelism attends: ``"ring"`` (K/V passed round the ring) or ``"ulysses"`` (all-to-alls)."""

    dp: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    zero: int = 0
    sequence_parallel: bool = False
    micro_batches: int = 1
    micro_batch: int = 1
    virtual: int = 1
    recompute: bool = False
    grad_bytes: int = 2
    top_k: int = 1
    cp_kind: str = "ring"
    value_bytes: int = 2

    def __post_init__(self) -> None:
        for name in ("dp", "tp", "pp", "cp", "ep", "micro_batches", "micro_batch", "virtual", "grad_bytes", "top_k",
                     "value_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.zero not in (0, 1, 2, 3):
            raise ValueError(f"zero must be a stage 0-3, got {self.zero}")
        if self.cp_kind not in CP_KINDS:
            raise ValueError(f"cp_kind must be one of {', '.join(CP_KINDS)}, got {self.cp_kind!r}")

    @property
    def gpus(self) -> int:
        return self.dp * self.tp * self.pp * self.cp



def ring_bytes(kind: str, nbytes: float, n: int) -> float:
    """Bytes one rank sends in a bandwidth-optimal ring over ``n`` ranks, for an input of ``nbytes``
    (each rank's full tensor; for an all-gather, the gathered result): an all-reduce ``2 (n-1)/n``, a
    reduce-scatter or an all-gather ``(n-1)/n``, an all-to-all ``(n-1)/n`` (all but its own share)."""
    factor = {"all_reduce": 2 * (n - 1) / n, "reduce_scatter": (n - 1) / n, "all_gather": (n - 1) / n,
              "all_to_all": (n - 1) / n, "send": 1.0}
    if kind not in factor:
        raise ValueError(f"no collective {kind!r}; choose one of {', '.join(factor)}")
    return factor[kind] * nbytes


def ring_steps(kind: str, n: int) -> int:
    """Ring steps, each paying the latency ``alpha`` once: ``2 (n-1)`` for an all-reduce, ``n-1`` otherwise."""
    return 1 if kind == "send" else (2 if kind == "all_reduce" else 1) * (n - 1)


def group_link(layout: StepLayout, group: str, hardware: Hardware) -> float:
    """Bandwidth of ``group``'s ring: NVLink when its members share one node, else the network.

    Groups nest in ``ORDER``: a group's members are ``stride`` GPUs apart, ``stride`` the product
    of the degrees inside it, so it spans ``stride * size`` consecutive GPUs."""
    stride = 1
    for name in ORDER[:ORDER.index(group)]:
        stride *= getattr(layout, name)
    inside = stride * getattr(layout, group) <= GPUS_PER_NODE
    return hardware.nvlink_bytes_per_s if inside else hardware.network_bytes_per_s


def collective_seconds(kind: str, nbytes: float, n: int, bandwidth: float, latency: float) -> float:
    """The alpha-beta cost: ``steps * alpha + ring_bytes / bandwidth`` (nothing to do alone)."""
    if n == 1 and kind != "send":
        return 0.0
    return ring_steps(kind, n) * latency + ring_bytes(kind, nbytes, n) / bandwidth

