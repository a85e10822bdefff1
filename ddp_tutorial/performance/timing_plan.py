"""The planner ranks by time: the layouts that fit, fastest first by the step-time model ("How fast, and why").

The capstone's ``planning.fitting_layouts`` keeps the layouts whose busiest rank fits the GPU's
memory; this module maps each to the step-time model's ``StepLayout`` (``stepmodel``) under a global
batch and orders them by predicted step time, so by tokens per second (every layout trains the same
batch). Each row shows its predicted MFU and the term its step spends most on. For Llama 3 405B on
16,384 H100s it puts Meta's published layout (``published``) in the ranking and says why they differ.

The global batch binds the data-parallel degree to the pipeline: ``dp × m × b = sequences`` (``m``
microbatches of ``b`` sequences per pipeline, context ranks sharing a sequence), so a larger ``dp``
leaves fewer microbatches and, with ``pp > 1``, a bigger bubble ``(pp - 1) / m``.

What the mapping assumes: the planner's recomputation "full" is the model's ``recompute`` (one more
forward); "keep-matmuls" keeps every matmul's output and recomputes only pointwise ops, which the model's
FLOPs (matmuls and attention) do not count, so it is priced as free. Sequence parallelism with every
``tp > 1`` (the calculator assumes it), bf16 gradients (``bf16-mixed``), no interleaving (``virtual = 1``).

    python -m ddp_tutorial.performance.timing_plan --plan llama3-405b --gpus 16384 --seq 8192
"""

from __future__ import annotations

from dataclasses import dataclass

from ddp_tutorial.capstone.planning import GIB, PLAN_MODELS, PlannedLayout, fitting_layouts
from ddp_tutorial.launch.errors import UsageParser
from ddp_tutorial.performance.flops import TransformerShape
from ddp_tutorial.performance.hardware import A100, B200, GPUS_PER_NODE, H100, H200, Hardware
from ddp_tutorial.performance.published import RUNS, PublishedRun
from ddp_tutorial.performance.stepmodel import StepLayout, StepTime, predict
from ddp_tutorial.sharding.calculator import ModelShape

__all__ = ["LLAMA3_BATCH_TOKENS", "TimedLayout", "plan_problem", "flops_shape", "step_layout", "terms",
           "dominant_term", "ranked_layouts", "distinct", "left_out", "published_comparison", "timed_report",
           "llama3_405b_report", "main"]

LLAMA3_BATCH_TOKENS = 2048 * 8192  # Table 4: 16 sequences per DP x 128 DP x 8K tokens = "16M tokens per batch"


@dataclass(frozen=True)
class TimedLayout:
    """A layout that fits (``planned``), as the step-time model runs it (``layout``), and its prediction."""

    planned: PlannedLayout
    layout: StepLayout
    step: StepTime

    def __str__(self) -> str:
        s = self.step
        return (f"{self.planned}  m {self.layout.micro_batches:>3}  {s.step_s:6.2f} s  "
                f"{s.tokens_per_s / 1e6:5.2f}M tok/s  MFU {s.mfu:4.0%}  mostly {dominant_term(s)}")


def plan_problem(*, gpus: int, batch_tokens: int, seq: int, micro_batch: int = 1,
                 gpus_per_node: int = GPUS_PER_NODE) -> str | None:
    """What is wrong with this planning problem, in one line, or ``None``."""
    if gpus < 1 or batch_tokens < 1 or seq < 1 or micro_batch < 1:
        return f"GPUs, batch tokens, sequence and micro-batch must be positive, got {gpus}, {batch_tokens}, {seq}, " \
               f"{micro_batch}"
    if gpus_per_node != GPUS_PER_NODE:
        return f"the step-time model's nodes hold {GPUS_PER_NODE} GPUs (performance.hardware), got {gpus_per_node}"
    if batch_tokens % (seq * micro_batch):
        return f"a batch of {batch_tokens} tokens is not a whole number of {micro_batch}-sequence microbatches of " \
               f"{seq} tokens: choose a multiple of {seq * micro_batch}"
    return None


def flops_shape(shape: ModelShape, seq: int) -> TransformerShape:
    """The calculator's shape as ``performance.flops`` sees it (biases and norms are too few FLOPs to count)."""
    return TransformerShape(vocab=shape.vocab, dim=shape.hidden, layers=shape.layers, heads=shape.heads, seq=seq,
                            kv_heads=shape.kv_heads or None, ffn_hidden=shape.mlp, gated=shape.gated)


def step_layout(row: PlannedLayout, *, sequences: int, micro_batch: int = 1) -> StepLayout | None:
    """``row`` as the step model's ``StepLayout`` training ``sequences`` per step, or ``None`` when ``dp``
    replicas cannot split them into whole microbatches."""
    # dp x m x b = sequences: the global batch fixes the product, so a larger dp leaves fewer
    # microbatches per pipeline and a larger bubble (pp - 1) / m
    if sequences % (row.dp * micro_batch):
        return None
    return StepLayout(dp=row.dp, tp=row.tp, pp=row.pp, cp=row.cp, zero=row.zero, sequence_parallel=row.tp > 1,
                  micro_batches=sequences // (row.dp * micro_batch), micro_batch=micro_batch,
                  recompute=row.recompute == "full")


def terms(step: StepTime) -> dict[str, float]:
    """The step's seconds by term; they add up to ``step.step_s``."""
    return {"compute": step.compute_s, "bubble": step.bubble_s,
            **{f"exposed {group.upper()}": s for group, s in step.exposed.items()}}


def dominant_term(step: StepTime) -> str:
    """The term the step spends most seconds on."""
    split = terms(step)
    return max(split, key=split.get)


def ranked_layouts(shape: ModelShape, *, gpus: int, hardware: Hardware, batch_tokens: int, seq: int | None = None,
                   gpu_gib: int = 80, micro_batch: int = 1, headroom: float = 0.1) -> list[TimedLayout]:
    """Every layout of ``fitting_layouts`` that the batch can feed, fastest first (ties: the cheaper by the
    planner's rules first). Pipelines may have uneven stages (Llama 3's 126 layers on 16)."""
    seq = seq or shape.seq
    problem = plan_problem(gpus=gpus, batch_tokens=batch_tokens, seq=seq, micro_batch=micro_batch)
    if problem:
        raise ValueError(problem)
    model = flops_shape(shape, seq)
    rows = []
    for row in fitting_layouts(shape, gpus=gpus, gpu_bytes=gpu_gib * GIB, seq=seq, micro_batch=micro_batch,
                               headroom=headroom, uneven_stages=True):
        layout = step_layout(row, sequences=batch_tokens // seq, micro_batch=micro_batch)
        if layout is not None:
            rows.append(TimedLayout(row, layout, predict(model, layout, hardware)))
    return sorted(rows, key=lambda r: (r.step.step_s, r.planned.cost()))


def distinct(ranked: list[TimedLayout]) -> list[TimedLayout]:
    """The fastest row of each ``(dp, tp, pp, cp)``, in ``ranked``'s order (ZeRO and recomputation often tie)."""
    seen: set[tuple[int, int, int, int]] = set()
    out = []
    for row in ranked:
        key = (row.layout.dp, row.layout.tp, row.layout.pp, row.layout.cp)
        if key not in seen:
            seen.add(key)
            out.append(row)
    return out


def left_out(best: TimedLayout, meta: TimedLayout, seq: int) -> list[str]:
    """What the model leaves out that bears on this difference, each clause computed from the two rows."""
    out = []
    if meta.step.bubble_s > best.step.bubble_s:
        p, m = meta.layout.pp, meta.layout.micro_batches
        out.append(f"the model charges Meta's {p} stages a bubble of (p - 1) / m = {p - 1}/{m} of a stage's work "
                   f"with no interleaving (v = 1): Meta's interleaved schedule (v not published) divides it by v")
    if best.layout.cp > meta.layout.cp:
        out.append(f"the first choice splits {seq}-token sequences over CP{best.layout.cp} (blocks of "
                   f"{seq // best.layout.cp} tokens): the model hides its K/V ring behind attention at the full matmul "
                   f"rate, where Meta kept context parallelism for 131K sequences")
    if meta.planned.recompute != "none":
        out.append(f"Meta's layout fits the calculator's bytes only with recompute {meta.planned.recompute} "
                   f"({meta.planned.bytes / GIB:.1f} GiB); Meta reports none at 8K (its memory tricks are not modelled)")
    return out + ["nor does it price a failure's blast radius, stragglers, or the pipeline's rebalanced stages"]


def published_comparison(ranked: list[TimedLayout], run: PublishedRun) -> list[str]:
    """Where ``run``'s layout stands among the distinct layouts of ``ranked``, next to the first choice, and why."""
    ranked = distinct(ranked)
    want = (run.layout.dp, run.layout.tp, run.layout.pp, run.layout.cp)
    place = next((i for i, r in enumerate(ranked, 1) if (r.layout.dp, r.layout.tp, r.layout.pp, r.layout.cp) == want),
                 None)
    name = f"TP{want[1]} PP{want[2]} CP{want[3]} DP{want[0]}"
    head = f"{run.model} as published ({run.source}): {name}, {run.tflops_per_gpu:.0f} TFLOPs/GPU, MFU {run.mfu:.0%}"
    if place is None:
        return [head, f"  {name} does not fit the memory limit here: the planner cannot rank it"]
    meta, best = ranked[place - 1], ranked[0]
    lines = [head, f"  ranked {place} of {len(ranked)} layouts: {meta}", f"  first choice:        {best}"]
    if place == 1:
        return lines + [f"  the model agrees with Meta: no layout that fits is predicted faster than {name}"]
    ours, theirs = terms(best.step), terms(meta.step)
    gain = max(ours, key=lambda t: theirs[t] - ours[t])  # where the first choice saves most
    lose = max(ours, key=lambda t: ours[t] - theirs[t])  # and where it pays most
    why = (f"  why: {meta.step.step_s / best.step.step_s - 1:.0%} faster by the model, since the first choice spends "
           f"{theirs[gain] - ours[gain]:.2f} s less on {gain} ({ours[gain]:.2f} s against {theirs[gain]:.2f} s)")
    if ours[lose] > theirs[lose]:
        why += f" and {ours[lose] - theirs[lose]:.2f} s more on {lose}"
    return lines + [why + ".", "  but " + "; ".join(left_out(best, meta, run.shape.seq)) + "."]


def timed_report(name: str, *, gpus: int, batch_tokens: int, hardware: Hardware = H100, gpu_gib: int = 80,
                 seq: int | None = None, top: int = 5) -> list[str]:
    """Lines for ``--plan NAME``: the fastest layouts, and a published run of the same problem beside them."""
    shape = PLAN_MODELS[name]
    seq = seq or shape.seq
    ranked = ranked_layouts(shape, gpus=gpus, hardware=hardware, batch_tokens=batch_tokens, seq=seq, gpu_gib=gpu_gib)
    lines = [f"{name} on {gpus} {hardware.name} ({gpu_gib} GiB), {batch_tokens} tokens a step in sequences of {seq}: "
             f"{len(ranked)} rows fit and divide the batch; the fastest of each layout first"]
    lines += [f"  {r}" for r in distinct(ranked)[:top]]
    for run in RUNS:
        if (run.model == "Llama 3 405B" and name == "llama3-405b" and run.gpus == gpus
                and run.shape.seq == seq and run.layout.dp * run.layout.micro_batches * seq == batch_tokens):
            lines += published_comparison(ranked, run)
    return lines


def llama3_405b_report(top: int = 5) -> list[str]:
    """Llama 3 405B on 16,384 H100s, 8K sequences, 16M tokens a step, beside Meta's TP8 PP16 DP128."""
    return timed_report("llama3-405b", gpus=16384, batch_tokens=LLAMA3_BATCH_TOKENS, hardware=H100,
                        seq=8192, top=top)



def main() -> None:
    parser = UsageParser(prog="python -m ddp_tutorial.performance.timing_plan", description=__doc__.splitlines()[0])
    parser.add_argument("--plan", choices=sorted(PLAN_MODELS), default="llama3-405b", help="the model to plan")
    parser.add_argument("--gpus", type=int, default=16384)
    parser.add_argument("--gpu-gib", type=int, default=80)
    parser.add_argument("--seq", type=int, default=None, help="sequence length (default: the model's)")
    parser.add_argument("--batch-tokens", type=int, default=LLAMA3_BATCH_TOKENS, help="tokens a step (global batch)")
    parser.add_argument("--hardware", choices=("a100", "h100", "h200", "b200"), default="h100")
    parser.add_argument("--top", type=int, default=5, help="how many of the fastest layouts to print")
    args = parser.parse_args()
    seq = args.seq or PLAN_MODELS[args.plan].seq
    problem = plan_problem(gpus=args.gpus, batch_tokens=args.batch_tokens, seq=seq)
    if problem or args.top < 1:
        parser.error(problem or f"--top must be at least 1, got {args.top}")
    hardware = {"a100": A100, "h100": H100, "h200": H200, "b200": B200}[args.hardware]
    print("\n".join(timed_report(args.plan, gpus=args.gpus, batch_tokens=args.batch_tokens, seq=seq,
                                 hardware=hardware, gpu_gib=args.gpu_gib, top=args.top)))


if __name__ == "__main__":
    main()
