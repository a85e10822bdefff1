"""Insert lesson 21's "each rank's bytes" and "choosing a layout" cells (issue 31, items 3 and 4).

    python insert_cells.py notebooks/21_capstone.ipynb

Puts the cells below after the cell whose source contains MARKER (section 6's step-time cell,
``row['step s'] * 1000``), so that they come before the cell that explains the Playbook's rules
for a cluster. Idempotent: cells whose ids (``c21-m01``...) are already there are not inserted
again. Written with nbformat as JupyterLab saves it; run ``make notebooks NB=...`` afterwards.
"""

from __future__ import annotations

import sys

import nbformat

MARKER = "row['step s'] * 1000"

CELLS = [
    ("markdown", """\
### Each rank's bytes, measured against the memory calculator

Lesson 16's calculator predicts what a rank holds at the peak of a step: parameters, gradients,
optimizer state, and the activations autograd saves for backward. Here it meets the composed run.
`memory_worker` trains one step (float32, after a first step that sets FSDP2 and the pipeline up)
and measures every rank: the model state from its real local shards (`to_local()`), and the
activations with a `saved_tensors_hooks` pack hook that counts each saved storage once and leaves
out the weights (FSDP2's gathered ones and TP's are model state). `predict` asks `bytes_per_rank`
for CharGPT's shape (no biases, LayerNorm, an untied head), FSDP2 as ZeRO-3 over `dp`, GPipe's
microbatches all in flight.

The calculator claims to be exact for data-parallel ranks and estimates the rest. `formula_gap`
names, term by term, what its formulas leave out for this model; the cell asserts
measured = predicted + gap **to the byte** on every rank. The ranks run on the CPU (gloo) on any
machine: the activation gaps are those of torch's CPU attention kernel (CUDA picks a fused kernel
by GPU, and it saves other things)."""),
    ("code", "from ddp_tutorial.capstone.rank_memory import TERMS, activation_gap, formula_gap, memory_runs, report\n\n"
             "show_source(activation_gap)"),
    ("code", """\
run32 = GPTRun(dtype=torch.float32)
measured_layouts = [Layout(dp=4), Layout(dp=2, tp=2), Layout(dp=2, pp=2)]
held = spawn(memory_runs, 4, args=([vars(lay) for lay in measured_layouts],), backend="gloo", timeout=240)
for i, lay in enumerate(measured_layouts):
    ranks = [held[r][i] for r in range(4)]
    for facts in ranks:
        gap = formula_gap(run32, lay, facts["stage"])
        assert all(facts["measured"][t] == facts["predicted"][t] + gap[t] for t in TERMS), (str(lay), facts["rank"])
        if lay == Layout(dp=4):  # where the calculator claims exact: FSDP2 is ZeRO-3
            assert all(gap[t] == 0 for t in ("parameters", "gradients", "optimizer states"))
    print("\\n".join(report(lay, ranks, run32)))
print("every rank of the 3 layouts: measured = calculator + stated gap, to the byte")"""),
    ("markdown", """\
Read it term by term:

- **`dp4`**: parameters, gradients and Adam's two moments are the calculator's exactly: FSDP2 divides
  each by `dp`, as ZeRO-3's `16Ψ/N` (here `4 + 4 + 8` bytes of float32) says. Its activations are a
  replica's 2 sequences' worth, plus what this model saves beyond the formula's block: `wo`'s input
  (the attention output, copied by `transpose` + `reshape`), rotary's `cos` and `sin`, the token ids.
- **`dp2 x tp2`**: the norms' weights stay whole on each `tp` rank (sequence parallelism replicates
  them; the formula divides everything by `tp`). Activations gain most: sequence parallelism gathers
  the sequence before `wq`/`wk`/`wv` and `w1`, and torch's `linear` keeps the gathered input, where
  Megatron's formula assumes it is gathered again in backward; the head's input is gathered too,
  and every `tp` rank holds the whole logits (the plan's `Replicate()` output).
- **`dp2 x pp2`**: the formula gives each end stage half of what lies outside the blocks; the
  first holds the embedding (64 bytes a rank fewer), the last the head and the final norm (64
  more). It also leaves the last stage's tail (final norm, head input, loss) out of a pipelined stage.

The largest gap, by reason, for one rank of `dp2 x tp2`:"""),
    ("code", """\
parts = activation_gap(run32, Layout(dp=2, tp=2), stage=0)
for reason, nbytes in parts.items():
    print(f"  {reason:<26} {nbytes:>6} B")
assert max(parts, key=parts.get) == "gathered inputs"  # sequence parallelism's gathers, kept for backward"""),
    ("markdown", """\
### Choosing a layout for a real model

The same calculator, applied to Llama 3 8B and 70B on nodes of 8 GPUs of 80 GiB (bf16 mixed precision,
Adam, a fused attention kernel, micro-batches of one sequence). `candidates` admits only the layouts
the Playbook's rules allow: `tp` within a node and dividing the heads, pipeline stages of whole
nodes, `dp` with the rest; `layout_table` prices each with ZeRO-1 or ZeRO-3 and each recomputation;
`fitting_layouts` keeps those under 90% of a GPU (the rest for buffers the formula does not count),
cheapest first: fewest pipeline stages, least recomputation, fewest context ranks, then fewest
tensor ranks."""),
    ("code", "from ddp_tutorial.capstone.planning import GIB, PLAN_MODELS, candidates, fitting_layouts, plan_report\n\n"
             "show_source(candidates)"),
    ("code", """\
for name, gpus, seq in (("llama3-8b", 64, None), ("llama3-70b", 64, None), ("llama3-70b", 8, None),
                        ("llama3-8b", 64, 131072)):
    print("\\n".join(plan_report(name, gpus=gpus, seq=seq, top=3)))
best = fitting_layouts(PLAN_MODELS["llama3-8b"], gpus=64, gpu_bytes=80 * GIB)[0]
assert (best.dp, best.tp, best.pp, best.cp, best.zero) == (64, 1, 1, 1, 1)  # 8B, 4k tokens: data parallel alone
assert not fitting_layouts(PLAN_MODELS["llama3-70b"], gpus=8, gpu_bytes=80 * GIB)  # 70B: one node is too few
first70 = fitting_layouts(PLAN_MODELS["llama3-70b"], gpus=64, gpu_bytes=80 * GIB)[0]
assert (first70.tp, first70.pp, first70.zero) == (2, 1, 3)
long = fitting_layouts(PLAN_MODELS["llama3-8b"], gpus=64, gpu_bytes=80 * GIB, seq=131072)
assert long[0].cp > 1 and not [r for r in long if r.cp == 1 and r.recompute == "none"]
assert all(r.tp <= 8 and (r.pp == 1 or 64 // r.pp % 8 == 0) for r in long)"""),
    ("markdown", """\
- **8B, 4k tokens, 64 GPUs**: data parallelism alone fits. ZeRO-1 keeps `2 + 2` bytes of each of
  the 8.03e9 parameters whole and shards the optimizer's 12: `(4 + 12/64)·Ψ = 31.3 GiB`, the
  activations the rest. No model parallelism is needed, and none is the cheapest.
- **70B**: `16·Ψ = 1.1 TB` of model state; one node cannot hold it even fully sharded
  (`16·Ψ/8 = 141 GB` per GPU). On 8 nodes ZeRO-3 fits with `tp2` already, but tightly (68 GiB);
  more `tp` inside the node leaves more room for activations.
- **8B, 128k tokens**: now activations, not weights, decide: without recomputation no layout
  without `cp` fits (the MLP alone keeps `3·2·s·ffn` bytes a layer, 42 GiB per GPU over 32 layers
  at `tp8`), so the sequence is split over `cp` ranks as well.

Why each dimension sits where it does on a cluster:"""),
]


def insert(path: str) -> int:
    """Insert ``CELLS`` after the ``MARKER`` cell of the notebook at ``path``; the number inserted."""
    nb = nbformat.read(path, as_version=nbformat.NO_CONVERT)
    ids = {cell.get("id") for cell in nb.cells}
    new = []
    for i, (kind, source) in enumerate(CELLS, 1):
        cell_id = f"c21-m{i:02d}"
        if cell_id in ids:
            continue
        cell = nbformat.v4.new_markdown_cell(source) if kind == "markdown" else nbformat.v4.new_code_cell(source)
        cell["id"] = cell_id
        new.append(cell)
    if not new:
        return 0
    at = [i for i, cell in enumerate(nb.cells) if MARKER in "".join(cell.source)]
    if len(at) != 1:
        raise SystemExit(f"{path}: {len(at)} cells contain {MARKER!r}; expected exactly one")
    nb.cells[at[0] + 1:at[0] + 1] = new
    with open(path, "w") as f:
        f.write(nbformat.writes(nb, version=nbformat.NO_CONVERT) + "\n")
    return len(new)


if __name__ == "__main__":
    for notebook in sys.argv[1:] or ["notebooks/21_capstone.ipynb"]:
        print(f"{notebook}: {insert(notebook)} cells inserted")
