"""Exercise 19.1 (medium), lesson 19_pipeline_schedules.ipynb: the 1F1B order of a pipeline stage.

Write one_f_one_b_order() below (its docstring is the contract: what must hold), then check it:
    check("one_f_one_b_order")                                 in the notebook
    python -m ddp_tutorial.exercises check one_f_one_b_order   from a shell
The checker's ranks read this file afresh each time: an edit counts at once.
Hints, one at a time: python -m ddp_tutorial.exercises show one_f_one_b_order [--hint 2 .. 2]
Start again from the stub: python -m ddp_tutorial.exercises reset one_f_one_b_order
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
    # Your code here; the checker calls one_f_one_b_order(stage, num_stages, num_micro) on every rank.
    raise NotImplementedError(
        'exercise 19.1 (one_f_one_b_order): not started yet, as expected for a fresh stub: '
        'my_exercises/one_f_one_b_order.py still raises NotImplementedError. Next: write '
        'one_f_one_b_order() there (its docstring is the contract, lesson '
        "19_pipeline_schedules.ipynb explains it, show('one_f_one_b_order') gives hints), then "
        'check again')
