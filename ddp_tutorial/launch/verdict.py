"""How a lesson's command line ends: one ``OK: claim`` or ``FAILED: claim`` line, and its exit status.

Every ``python -m ddp_tutorial.<part>.<module>`` that checks a claim (equal to one process, a
checkpoint loads back exactly) ends with ``verdict``: the rank that reports (rank 0) prints the
line, and every rank exits 1 on failure, so ``torchrun``, ``make gpu-check`` (which reads both the
line and the exit code) and CI see a failure without parsing anything else.

    >>> verdict(True, "ring attention over 2 rank(s) equals SDPA")
    OK: ring attention over 2 rank(s) equals SDPA
"""

from __future__ import annotations


def verdict(ok: bool, claim: str, *, show: bool = True) -> None:
    """Print ``OK: claim`` or ``FAILED: claim`` where ``show`` (the reporting rank), then exit 1 if not ``ok``.

    Every rank calls it with the same ``ok`` (the ranks agreed on it, or rank 0 decided and the others
    learnt it), so that all of them exit with the same status.
    """
    if show:
        print(f"{'OK' if ok else 'FAILED'}: {claim}", flush=True)
    if not ok:
        raise SystemExit(1)
