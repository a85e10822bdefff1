"""Typical wrong answers to the exercises of lesson 20 (20.1 and 20.2), and the words their diagnosis must contain.

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

CAUSAL = "causal_ring_attention"
PAIR_LOOP = """        for a, i in enumerate(mine):
            for b, j in enumerate(held):
                if j > i:  # every key of chunk j comes after every query of chunk i
                    continue
"""

MISTAKES.update({
    "causal ring: the global mask on every block, nothing skipped": (
        CAUSAL, broken(CAUSAL, PAIR_LOOP, """        for a, i in enumerate(mine):
            for b, j in enumerate(held):
""").replace("""                if j == i:
                    s = s.masked_fill(diagonal_mask, float("-inf"))
                lse_b = torch.logsumexp(s, dim=-1)  # finite: a query always sees itself
                o_b = torch.exp(s - lse_b.unsqueeze(-1)) @""", """                positions = torch.arange(c, device=q.device)
                s = s.masked_fill(j * c + positions > i * c + positions.unsqueeze(1), float("-inf"))
                lse_b = torch.logsumexp(s, dim=-1)
                o_b = torch.exp(s - lse_b.nan_to_num(neginf=0.0).unsqueeze(-1)) @"""),
        ["world of 1", "computes the blocks the causal mask hides entirely", "4 chunk pairs", "2N + 1 = 3",
         "skip it rather than mask it"], 30),
    "causal ring: the contiguous placement instead of zig-zag": (
        CAUSAL, broken(CAUSAL, "    mine = (rank, 2 * n - 1 - rank)", "    mine = (2 * rank, 2 * rank + 1)")
        .replace("        held = (sender, 2 * n - 1 - sender)", "        held = (2 * sender, 2 * sender + 1)"),
        ["world of 2", "the contiguous placement", "zig-zag layout", "chunks 0 and 3 of 4"], 30),
    "causal ring: the diagonal block unmasked": (
        CAUSAL, broken(CAUSAL, '                    s = s.masked_fill(diagonal_mask, float("-inf"))',
                       "                    pass"),
        ["world of 1", "diagonal blocks", "unmasked", "triangular mask"], 30),
    "causal ring: the mask with local positions on every block": (
        CAUSAL, broken(CAUSAL, "                if j == i:\n                    s = s.masked_fill(",
                       "                if j <= i:\n                    s = s.masked_fill("),
        ["world of 1", "positions inside each block (local) instead of global"], 30),
    "causal ring: no running max, exp(s) summed and divided at the end": (
        CAUSAL, broken(CAUSAL, """                lse_b = torch.logsumexp(s, dim=-1)  # finite: a query always sees itself
                o_b = torch.exp(s - lse_b.unsqueeze(-1)) @ kv[1, :, :, b * c:(b + 1) * c]
                new = torch.logaddexp(lses[a], lse_b)
                outs[a] = outs[a] * torch.exp(lses[a] - new).unsqueeze(-1) + o_b * torch.exp(lse_b - new).unsqueeze(-1)
                lses[a] = new""", """                outs[a] = outs[a] + torch.exp(s) @ kv[1, :, :, b * c:(b + 1) * c]
                lses[a] = torch.where(torch.isinf(lses[a]), 0.0, lses[a]) + torch.exp(s).sum(-1)""")
        .replace("    return torch.cat(outs, dim=2)",
                 "    return torch.cat([o / den.unsqueeze(-1) for o, den in zip(outs, lses)], dim=2)"),
        ["world of", "scores near 100 in float32", "exp(100) overflows", "running maximum"], 30),
    "causal ring: K/V gathered with all_gather": (
        CAUSAL, broken(CAUSAL, "    kv = torch.stack([k, v])  # one message per hop",
                       "    kv = torch.stack([k, v])\n    every = [torch.empty_like(kv) for _ in range(n)]\n"
                       "    dist.all_gather(every, kv)"),
        ["NotAllowed", "dist.all_gather is not allowed", "asks for the ring"], 30),
    "causal ring: every K/V block kept, SDPA once on the whole sequence": (
        CAUSAL, broken(CAUSAL, "    kv = torch.stack([k, v])  # one message per hop",
                       "    kv = torch.stack([k, v])  # one message per hop\n    kept = []")
        .replace("        for work in works:", "        kept.append(kv)\n        for work in works:")
        .replace("    return torch.cat(outs, dim=2)", "    if n == 1:\n        return torch.cat(outs, dim=2)\n"
                 "    every = torch.cat(kept, dim=3)  # then one attention over every key\n"
                 "    return torch.nn.functional.scaled_dot_product_attention(q, every[0], every[1])"),
        ["world of 2", "the whole sequence's keys (or scores) held at once"], 30),
    "causal ring: the own block only, the arriving ones never computed with": (
        CAUSAL, broken(CAUSAL, "    for hop in range(n):", "    for hop in range(1):"),
        ["world of 2", "this rank's own keys only"], 30),
})

ALSO_RIGHT.update({
    "causal ring: both query chunks in one product where the mask allows": (
        CAUSAL, broken(CAUSAL, PAIR_LOOP + """                s = qs[a] @ kv[0, :, :, b * c:(b + 1) * c].transpose(-2, -1) / math.sqrt(q.shape[-1])
                if j == i:
                    s = s.masked_fill(diagonal_mask, float("-inf"))
                lse_b = torch.logsumexp(s, dim=-1)  # finite: a query always sees itself
                o_b = torch.exp(s - lse_b.unsqueeze(-1)) @ kv[1, :, :, b * c:(b + 1) * c]
                new = torch.logaddexp(lses[a], lse_b)
                outs[a] = outs[a] * torch.exp(lses[a] - new).unsqueeze(-1) + o_b * torch.exp(lse_b - new).unsqueeze(-1)
                lses[a] = new
""", """        if hop == 0:  # my own chunks: two diagonals and chunk 2N-1-r's queries over chunk r's keys
            pieces = [(0, slice(0, c), True), (1, slice(c, 2 * c), True), (1, slice(0, c), False)]
        elif sender < rank:  # keys of chunk s only (chunk 2N-1-s is after both), for both query chunks
            pieces = [(None, slice(0, c), False)]
        else:  # every key held, for the late query chunk only (both are after the early one)
            pieces = [(1, slice(0, 2 * c), False)]
        for a, keys, diagonal in pieces:
            qa = q if a is None else qs[a]
            s = qa @ kv[0, :, :, keys].transpose(-2, -1) / math.sqrt(q.shape[-1])
            if diagonal:
                s = s.masked_fill(diagonal_mask, float("-inf"))
            lse_b = torch.logsumexp(s, dim=-1)
            o_b = torch.exp(s - lse_b.unsqueeze(-1)) @ kv[1, :, :, keys]
            for part, rows in ((0, slice(0, c)), (1, slice(c, 2 * c))) if a is None else ((a, slice(None)),):
                new = torch.logaddexp(lses[part], lse_b[..., rows])
                outs[part] = (outs[part] * torch.exp(lses[part] - new).unsqueeze(-1)
                              + o_b[:, :, rows] * torch.exp(lse_b[..., rows] - new).unsqueeze(-1))
                lses[part] = new
"""), 30),
})
