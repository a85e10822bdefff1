"""Typical wrong answers to lesson 19's exercises, and the words their diagnosis must contain.

Same format as ``exercise_mistakes``: ``(exercise, source, words, timeout in seconds)``; ``ALSO_RIGHT``
holds other right answers to 19.2, which must pass.
"""

from __future__ import annotations

from exercise_mistakes import broken

WARMUP = "    warmup = min(num_stages - 1 - stage, num_micro)"

MISTAKES = {
    "GPipe's order: every forward first": (
        "one_f_one_b_order",
        "def one_f_one_b_order(stage, num_stages, num_micro):\n"
        "    return [f'F{i}' for i in range(num_micro)] + [f'B{i}' for i in range(num_micro)]\n",
        ["world of 1", "stage 0 holds 2 micro-batches' activations", "at most p - s = 1"], 30),
    "the first stage waits for each backward, the others run GPipe": (
        "one_f_one_b_order",
        "def one_f_one_b_order(stage, num_stages, num_micro):\n"
        "    if stage == 0:\n"
        "        return [a for i in range(num_micro) for a in (f'F{i}', f'B{i}')]\n"
        "    return [f'F{i}' for i in range(num_micro)] + [f'B{i}' for i in range(num_micro)]\n",
        ["world of 2", "wait for each other forever", "stage 0 at step 1 (B0) waits for stage 1's B0"], 30),
    "no warm-up: a forward and its backward in turn on every stage": (
        "one_f_one_b_order",
        "def one_f_one_b_order(stage, num_stages, num_micro):\n"
        "    return [a for i in range(num_micro) for a in (f'F{i}', f'B{i}')]\n",
        ["world of 2", "safe, but slow", "1F1B takes 9"], 30),
    "a warm-up one forward too long": (
        "one_f_one_b_order", broken("one_f_one_b_order", WARMUP, WARMUP.replace("- 1 - stage", "- stage")),
        ["world of 1", "stage 0 holds 2 micro-batches' activations"], 30),
    "a warm-up not capped at the number of micro-batches": (
        "one_f_one_b_order", broken("one_f_one_b_order", WARMUP, "    warmup = num_stages - 1 - stage"),
        ["world of 3", "1 micro-batches on 3 stages", "cap the warm-up at m: min(p - 1 - s, m)"], 30),
}

# Exercise 19.2: one 1F1B training step with real messages (the reference with one thing changed)
STEP = "one_f_one_b_step"
LOOPS = """    warmup = min(num_stages - 1 - stage, num_micro)
    for i in range(warmup):
        forward(i)
    for i in range(warmup, num_micro):
        forward(i)
        backward(i - warmup)
    for i in range(num_micro - warmup, num_micro):
        backward(i)
"""
SEND_OUT = "sends.append(dist.isend(out.detach(), dst=stage + 1))"
SEND_GRAD = "        if not first:\n            sends.append(dist.isend(h.grad, dst=stage - 1))\n"
RECV_IN = "dist.irecv(h, src=stage - 1).wait()"
RECV_GRAD = "dist.irecv(grad, src=stage + 1).wait()"
POP = "        h, out = inputs.pop(i), outputs.pop(i)\n"


def step(*changes: tuple[str, str]) -> str:
    """The reference 1F1B step with each ``(old, new)`` of ``changes`` put in."""
    source = broken(STEP, *changes[0])
    for old, new in changes[1:]:
        assert old in source, old
        source = source.replace(old, new)
    return source


MISTAKES.update({
    "19.2 GPipe's order: every forward, then every backward": (
        STEP, step((LOOPS, "    for i in range(num_micro):\n        forward(i)\n"
                           "    for i in range(num_micro):\n        backward(i)\n")),
        ["world of 2", "2 micro-batches on 2 stages", "GPipe order: all forwards before any backward holds m "
         "activations", "stage 1 ran F0 F1 B0 B1 and held 2 micro-batches' activations"], 60),
    "19.2 a warm-up not capped at m": (
        STEP, step(("    warmup = min(num_stages - 1 - stage, num_micro)", "    warmup = num_stages - 1 - stage")),
        ["rank 0 of a world of 3", "1 micro-batch on 3 stages", "IndexError",
         "cap the warm-up at m, min(p - 1 - s, m)"], 60),
    "19.2 the gradient sent to the next stage instead of the previous": (
        STEP, step(("dist.isend(h.grad, dst=stage - 1)", "dist.isend(h.grad, dst=stage + 1)")),
        ["rank 1 of a world of 2", "stage 1 of 2 sends to rank 2, which is not a neighbour stage",
         "gradients back to stage s - 1"], 60),
    "19.2 the gradient never sent back": (
        STEP, step((SEND_GRAD, "")),
        ["world of 2", "rank 0 is stuck in wait for irecv from rank 1", "never sends"], 20),
    "19.2 the input sent back instead of its gradient": (
        STEP, step(("dist.isend(h.grad, dst=stage - 1)", "dist.isend(h.detach(), dst=stage - 1)")),
        ["rank 0 of a world of 2", "stage 0's gradients differ from one process's while stage 1's are right",
         "the gradient of its input"], 60),
    "19.2 the gradients zeroed between micro-batches": (
        STEP, step((POP, POP + "        module.zero_grad()\n")),
        ["2 micro-batches on 2 stages", "the last micro-batch's share only", "zeroed between micro-batches"], 60),
    "19.2 the loss not divided by m": (
        STEP, step(("out = loss_fn(out, i) / num_micro", "out = loss_fn(out, i)")),
        ["2 micro-batches on 2 stages", "2 times one process's", "the loss was not divided by m"], 60),
    "19.2 blocking sends: both neighbours send first in the steady state": (
        STEP, step((SEND_OUT, "dist.send(out.detach(), dst=stage + 1)"),
                   ("sends.append(dist.isend(h.grad, dst=stage - 1))", "dist.send(h.grad, dst=stage - 1)")),
        ["2 micro-batches on 2 stages", "rank 0 is stuck in send to rank 1", "rank 1 is stuck in send to rank 0",
         "both send first"], 20),
    "19.2 torch's Schedule1F1B runs the step": (
        STEP, "def one_f_one_b_step(module, stage, num_stages, *, num_micro, micro_batches, loss_fn, shape):\n"
              "    from torch.distributed.pipelining import PipelineStage, Schedule1F1B\n"
              "    raise RuntimeError('not reached')\n",
        ["imports torch.distributed.pipelining", "the exercise is to write this yourself"], 30),
})

# Other right answers the checker must accept: name -> (exercise, source, timeout in seconds)
ALSO_RIGHT = {
    "19.2 every message through batch_isend_irecv and P2POp": (
        STEP, step((RECV_IN, "for w in dist.batch_isend_irecv([dist.P2POp(dist.irecv, h, stage - 1)]):\n"
                             "                w.wait()"),
                   (RECV_GRAD, "for w in dist.batch_isend_irecv([dist.P2POp(dist.irecv, grad, stage + 1)]):\n"
                               "                w.wait()"),
                   (SEND_OUT, "sends.extend(dist.batch_isend_irecv([dist.P2POp(dist.isend, out.detach(), stage + 1)]))"),
                   ("sends.append(dist.isend(h.grad, dst=stage - 1))",
                    "sends.extend(dist.batch_isend_irecv([dist.P2POp(dist.isend, h.grad, stage - 1)]))")), 90),
    "19.2 blocking recv, and blocking sends of the gradients only (a safe order)": (
        STEP, step((RECV_IN, "dist.recv(h, src=stage - 1)"), (RECV_GRAD, "dist.recv(grad, src=stage + 1)"),
                   ("sends.append(dist.isend(h.grad, dst=stage - 1))", "dist.send(h.grad, dst=stage - 1)")), 90),
    "19.2 the order written out first, then run action by action": (
        STEP, step((LOOPS, "    w = min(num_stages - 1 - stage, num_micro)\n"
                           "    steady = [a for i in range(w, num_micro) for a in (('F', i), ('B', i - w))]\n"
                           "    order = [('F', i) for i in range(w)] + steady + [('B', i) for i in range(num_micro - w, num_micro)]\n"
                           "    for kind, i in order:\n"
                           "        (forward if kind == 'F' else backward)(i)\n")), 90),
}
