"""Exercise 19.1, reference solution: the 1F1B order of one pipeline stage.

Stage ``s`` of ``p`` first runs ``p - 1 - s`` forwards: enough that, when the last stage's
first backward comes back, every stage has work. Then it alternates one forward (a new
micro-batch in) and one backward (the oldest out), so it never holds more than ``p - s``
micro-batches. Then it runs the backwards that are left. With fewer micro-batches than
stages the warm-up is cut to ``m``. The last stage has no warm-up: F0 B0 F1 B1 ...
"""

from __future__ import annotations


def one_f_one_b_order(stage: int, num_stages: int, num_micro: int) -> list[str]:
    """Return stage ``stage``'s actions under 1F1B, as ``"F<i>"`` / ``"B<i>"`` strings in order.

    Each of the ``num_micro`` micro-batches appears once as a forward and once as a backward,
    its forward first. Run on every stage at once (receives block, sends do not), the orders
    must never deadlock, stage ``s`` must never hold more than ``num_stages - s`` micro-batches
    (forwards done whose backward is not), and the pipeline must take no longer than 1F1B's
    ``(m + p - 1)`` forward-plus-backward slots.
    """
    warmup = min(num_stages - 1 - stage, num_micro)
    order = [f"F{i}" for i in range(warmup)]
    for i in range(warmup, num_micro):
        order += [f"F{i}", f"B{i - warmup}"]
    order += [f"B{i}" for i in range(num_micro - warmup, num_micro)]
    return order
