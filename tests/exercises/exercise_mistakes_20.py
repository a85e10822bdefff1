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
        ["NotAllowed", "dist.all_gather is not allowed", "asks for the ring", "valid design"], 20),
    "ring attention: every K/V block kept, SDPA once on the whole sequence (no merge)": (
        NAME, broken(NAME, "    kv = torch.stack([k, v])  # one message per hop",
                     "    kv = torch.stack([k, v])  # one message per hop\n    held = []")
        .replace("        s = q @ kv[0]", "        held.append(kv)\n        s = q @ kv[0]")
        .replace("    return out", "    every = torch.cat(held, dim=3)\n"
                 "    return torch.nn.functional.scaled_dot_product_attention(q, every[0], every[1])"),
        ["world of 2", "the whole sequence's keys (or scores) held at once", "log-sum-exp"], 20),
    "ring attention: every block's scores kept, one softmax at the end": (
        NAME, broken(NAME, "    kv = torch.stack([k, v])  # one message per hop",
                     "    kv = torch.stack([k, v])  # one message per hop\n    ss, vs = [], []")
        .replace("        lse_b = torch.logsumexp(s, dim=-1)", "        ss.append(s)\n        vs.append(kv[1])\n"
                 "        lse_b = torch.logsumexp(s, dim=-1)")
        .replace("    return out", "    return torch.softmax(torch.cat(ss, dim=-1), dim=-1) @ torch.cat(vs, dim=2)"),
        ["world of 2", "the whole sequence's keys (or scores) held at once"], 20),
    "ring attention: no running max, exp(s) summed and divided at the end": (
        NAME, broken(NAME, "    lse = torch.full(q.shape[:-1], float(\"-inf\"), dtype=q.dtype, device=q.device)",
                     "    den = torch.zeros(q.shape[:-1], dtype=q.dtype, device=q.device)")
        .replace("""        lse_b = torch.logsumexp(s, dim=-1)
        o_b = torch.exp(s - lse_b.unsqueeze(-1)) @ kv[1]
        new = torch.logaddexp(lse, lse_b)
        out = out * torch.exp(lse - new).unsqueeze(-1) + o_b * torch.exp(lse_b - new).unsqueeze(-1)
        lse = new""", """        out = out + torch.exp(s) @ kv[1]
        den = den + torch.exp(s).sum(-1)""")
        .replace("    return out", "    return out / den.unsqueeze(-1)"),
        ["scores near 100 in float32", "exp(100) overflows", "running maximum"], 20),
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
