"""Typical wrong answers to the exercise of lesson 20, and the words their diagnosis must contain.

Same format as ``exercise_mistakes``: ``(exercise, source, words, timeout in seconds)``;
``ALSO_RIGHT`` holds other right answers, which must pass.
"""

from __future__ import annotations

from exercise_mistakes import broken

NAME = "ring_attention_forward"

MISTAKES = {
    "ring attention: the blocks averaged, no log-sum-exp weights": (
        NAME, broken(NAME, "        out = out * torch.exp(lse - new).unsqueeze(-1) + o_b * torch.exp(lse_b - new).unsqueeze(-1)",
                     "        out = out + o_b / n"),
        ["world of 2", "plain mean of the blocks' outputs", "exp(lse_b - lse)"], 20),
    "ring attention: own block only, nothing travels": (
        NAME, broken(NAME, "            kv = arriving", "            pass"),
        ["world of 2", "this rank's own keys only"], 20),
    "ring attention: all-gather the keys": (
        NAME, broken(NAME, "    kv = torch.stack([k, v])  # one message per hop",
                     "    kv = torch.stack([k, v])\n    dist.all_gather([torch.empty_like(k) for _ in range(n)], k)"),
        ["NotAllowed", "dist.all_gather is not allowed", "gathering every rank's keys"], 20),
    "ring attention: one hop too many": (
        NAME, broken(NAME, "        if hop < n - 1:  # start", "        if n > 1:  # start"),
        ["world of 2", "the output is right, but rank", "N - 1 = 1 hops"], 20),
}

ALSO_RIGHT = {
    "ring attention with batch_isend_irecv and k, v sent apart": (
        NAME, broken(NAME, "            works = [dist.isend(kv, dst=(rank + 1) % n), dist.irecv(arriving, src=(rank - 1) % n)]",
                     "            works = dist.batch_isend_irecv(\n"
                     "                [dist.P2POp(dist.isend, kv[0].contiguous(), (rank + 1) % n),\n"
                     "                 dist.P2POp(dist.isend, kv[1].contiguous(), (rank + 1) % n),\n"
                     "                 dist.P2POp(dist.irecv, arriving[0], (rank - 1) % n),\n"
                     "                 dist.P2POp(dist.irecv, arriving[1], (rank - 1) % n)])"), 20),
}
