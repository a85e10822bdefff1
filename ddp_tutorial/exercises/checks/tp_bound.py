"""Lesson 23's exercises 23.6 and 23.7: a Megatron layer's TP traffic over its compute, and the TP degree
past which it is communication-bound on NVLink (``lesson_how_fast_limits`` lists them).

The reference, written out here (the tests hold it against ``stepmodel``'s ``tp_seconds`` and
``flops.training_flops``): one layer, one microbatch of ``b`` sequences of ``s`` tokens, forward and
backward. Compute: ``(6 P + 12 s h) b s / t`` FLOPs per GPU at the matmul rate. Traffic: four ring
all-reduces of the ``b s h`` bf16 activations, each ``2 (t - 1)`` latencies and ``2 (t - 1) / t`` of the
bytes over the link; none of it hidden. The limit is the largest ``t`` of 1 to 8 (one node) that
divides the heads with traffic at most the compute. Each knob (``estimates.Knobs``, evaluated at a
``t``) is one term's right choice and its typical mistakes; 23.7 names the single mistakes whose
limit is the learner's.
"""

from __future__ import annotations

from collections.abc import Callable

from ddp_tutorial.exercises.checks.estimates import Knobs, fewest_mistakes, not_a_number, verdict
from ddp_tutorial.exercises.exercise import Exercise
from ddp_tutorial.exercises.harness import Case, Report, load_function, run_cases
from ddp_tutorial.exercises.tracing import traced

REFUSED = ("ddp_tutorial.performance", "ddp_tutorial.sharding.calculator")
NODE = 8  # GPUs per node: TP stays on NVLink
# (label, dim, seq, heads, micro_batch, layer_params, matmul FLOP/s, link bytes/s one way, latency s per ring step);
# GPT layers (12 dim^2 weights), the course's hardware figures (``performance.hardware``: achievable, NVLink one way)
H100 = (794.5e12, 450e9, 6e-6)
B200 = (1745e12, 900e9, 6e-6)
LAYERS = {
    "b200-1536": ("a layer of dim 1536 (24 heads), seq 8192, micro-batch 2, on B200s", 1536, 8192, 24, 2,
                  12 * 1536 ** 2, *B200),
    "h100-1536": ("a layer of dim 1536 (24 heads), seq 8192, micro-batch 2, on H100s", 1536, 8192, 24, 2,
                  12 * 1536 ** 2, *H100),
    "h100-5120": ("a layer of dim 5120 (40 heads), seq 4096, micro-batch 2, on H100s", 5120, 4096, 40, 2,
                  12 * 5120 ** 2, *H100),
}
RATIO_CASES = [("h100-1536", 3), ("b200-1536", 4), ("h100-5120", 8), ("h100-1536", 1)]  # (layer, t)
LIMIT_CASES = ["b200-1536", "h100-1536", "h100-5120"]  # limits 4, 6 and 8 (a t past 8 would be 10)
Option = tuple["str | None", Callable[[int], float]]


def ratio_knobs() -> dict[str, list[Option]]:
    """Each term of the ratio, as a function of t: the right choice first, then the typical mistakes."""
    return {
        "passes": [(None, lambda t: 3),
                   ("the compute of the forward alone against the traffic of forward and backward: the backward's "
                    "2x forgotten on the compute side (6 P + 12 s h FLOPs per token, not 2 P + 4 s h)", lambda t: 1)],
        "attention": [(None, lambda t: 1), ("attention's 12 s h FLOPs per token (Q K^T and P V) left out of the "
                                            "compute", lambda t: 0)],
        "split": [(None, lambda t: t), ("the compute not divided by t: each of the t GPUs does 1 / t of the "
                                        "layer's FLOPs", lambda t: 1)],
        "collectives": [(None, lambda t: 4),
                        ("two all-reduces per layer, the forward's: the backward has two more, 4 in all (the "
                         "backward's 2 forgotten on the traffic side)", lambda t: 2),
                        ("one all-reduce per layer: Megatron's layer has two forward (after attention, after "
                         "the MLP) and two backward", lambda t: 1)],
        "hops": [(None, lambda t: 2 * (t - 1)),
                 ("the latency left out: each all-reduce's 2 (t - 1) ring steps pay it", lambda t: 0),
                 ("t - 1 latencies per all-reduce: a reduce-scatter then an all-gather, 2 (t - 1) ring steps",
                  lambda t: t - 1),
                 ("one latency per all-reduce: each of its 2 (t - 1) ring steps pays it", lambda t: 1)],
        "share": [(None, lambda t: 2 * (t - 1) / t),
                  ("the (t - 1) / t forgotten: each rank sends 2 (t - 1) / t of the activations, not 2x",
                   lambda t: 2),
                  ("(t - 1) / t of the activations, a reduce-scatter's: an all-reduce sends 2 (t - 1) / t",
                   lambda t: (t - 1) / t),
                  ("the activations once: an all-reduce sends 2 (t - 1) / t of them", lambda t: 1)],
        "value": [(None, lambda t: 2), ("4 bytes a value: the activations are bf16, 2 bytes", lambda t: 4),
                  ("bits for bytes: a bf16 value is 16 bits, 2 bytes", lambda t: 16)],
    }


def at(t: int) -> Knobs:
    """``ratio_knobs`` at ``t``, an option dropped where an earlier one gives its value."""
    out: Knobs = {}
    for term, options in ratio_knobs().items():
        kept: list[tuple[str | None, float]] = []
        for words, value in options:
            if all(value(t) != v for _, v in kept):
                kept.append((words, value(t)))
        out[term] = kept
    return out


def ratio(t: int, layer: tuple, k: dict[str, float]) -> float:
    """Traffic seconds over compute seconds for one choice of every term."""
    _, dim, seq, _, b, params, rate, link, alpha = layer
    tokens = b * seq
    compute = k["passes"] * (2 * params + 4 * seq * dim * k["attention"]) * tokens / k["split"] / rate
    traffic = k["collectives"] * (k["hops"] * alpha + k["share"] * k["value"] * tokens * dim / link)
    return traffic / compute


def right(t: int, layer: tuple) -> float:
    return ratio(t, layer, {term: options[0][1] for term, options in at(t).items()})


def with_mistake(t: int, layer: tuple, words: str) -> float:
    """The ratio at ``t`` with the one mistake ``words`` (the right value where it gives the same)."""
    k = {term: next((v for m, v in options if m == words), options[0][1]) for term, options in at(t).items()}
    return ratio(t, layer, k)


def limit(layer: tuple, ratio_at: Callable[[int], float], ts: range = range(1, NODE + 1), *,
          divide: bool = True) -> int:
    """The largest t of ``ts`` (dividing the heads, unless ``divide`` is False) with ``ratio_at(t) <= 1``."""
    return max(t for t in ts if (t == 1 or ratio_at(t) <= 1) and (not divide or layer[3] % t == 0))


def call_args(layer: tuple) -> str:
    _, dim, seq, heads, b, params, rate, link, alpha = layer
    return (f"{dim}, {seq}, {heads}, micro_batch={b}, layer_params={params}, matmul_flops={rate:g}, "
            f"link_bytes_per_s={link:g}, latency_s={alpha:g}")


def kwargs(layer: tuple) -> dict:
    _, _, _, _, b, params, rate, link, alpha = layer
    return {"micro_batch": b, "layer_params": params, "matmul_flops": rate, "link_bytes_per_s": link,
            "latency_s": alpha}


def wrong_ratio(got: object, t: int, layer: tuple) -> str | None:
    """None if ``got`` is the ratio at ``t``; else the fewest typical mistakes that give it."""
    call = f"tp_comm_to_compute({t}, {call_args(layer).replace(f', {layer[3]}, ', ', ')})"
    wrong = not_a_number(got)
    if wrong:
        return f"{call} {wrong}"
    want = right(t, layer)
    if abs(got - want) <= 1e-9 * abs(want):
        return None
    mistakes = fewest_mistakes(float(got), at(t), lambda k: ratio(t, layer, k), rel=1e-9)
    return verdict(call, float(got), want, mistakes,
                   "4 all-reduces of the b s h bf16 activations, each 2 (t - 1) latencies and 2 (t - 1) / t of "
                   "the bytes over the link, over (6 P + 12 s h) b s / t FLOPs at the matmul rate")


def wrong_limit(got: object, layer: tuple) -> str | None:
    """None if ``got`` is the layer's limit; else the single typical mistakes whose limit it is."""
    call = f"tp_limit({call_args(layer)})"
    if isinstance(got, bool) or not isinstance(got, int):
        return f"{call} returned {type(got).__name__} {got!r}, not a TP degree (an int)"
    want = limit(layer, lambda t: right(t, layer))
    if got == want:
        return None
    mistakes = [words for options in ratio_knobs().values() for words, _ in options[1:]
                if limit(layer, lambda t, w=words: with_mistake(t, layer, w)) == got]
    if limit(layer, lambda t: right(t, layer), divide=False) == got:
        mistakes.append(f"a t that does not divide the {layer[3]} heads: each rank takes heads / t whole heads")
    if limit(layer, lambda t: right(t, layer), range(1, layer[3] + 1)) == got:
        mistakes.append(f"a t past {NODE}: one node has {NODE} GPUs, and TP stays on its NVLink")
    bound = [t for t in range(want + 1, NODE + 1) if layer[3] % t == 0]
    if bound and bound[0] == got:
        mistakes.append(f"the first t that is communication-bound: the answer is the last that is not, {want}")
    shown = ", ".join(f"{right(t, layer):.4g} at t = {t}" for t in range(2, NODE + 1) if layer[3] % t == 0)
    head = f"{call} returned {got}, expected {want} (traffic over compute: {shown})"
    return f"{head}: " + "; or ".join(mistakes) if mistakes else f"{head}; no single typical mistake gives {got}"


def tp_comm_to_compute_worker(rank: int, world_size: int, source: str, function: str, trace_dir: str) -> Report:
    """Each case of ``RATIO_CASES``: the learner's ratio against the reference, else the mistakes."""
    with traced(rank, trace_dir) as trace:
        fn = load_function(source, function, refuse=REFUSED)

        def case(key: str, t: int) -> str | None:
            layer = LAYERS[key]
            return wrong_ratio(fn(t, layer[1], layer[2], **kwargs(layer)), t, layer)

        cases: list[Case] = [(f"{LAYERS[key][0]}, t = {t}", lambda a=(key, t): case(*a)) for key, t in RATIO_CASES]
        return run_cases(trace, cases)


def tp_limit_worker(rank: int, world_size: int, source: str, function: str, trace_dir: str) -> Report:
    """Each case of ``LIMIT_CASES``: the learner's TP degree against the reference, else the mistakes."""
    with traced(rank, trace_dir) as trace:
        fn = load_function(source, function, refuse=REFUSED)

        def case(key: str) -> str | None:
            layer = LAYERS[key]
            return wrong_limit(fn(layer[1], layer[2], layer[3], **kwargs(layer)), layer)

        cases: list[Case] = [(LAYERS[key][0], lambda key=key: case(key)) for key in LIMIT_CASES]
        return run_cases(trace, cases)


TP_EXERCISES = [
    Exercise(
        name="tp_comm_to_compute", number="23.6", lesson=23, notebook="23_how_fast.ipynb",
        title="a Megatron layer's TP traffic over its compute, on NVLink", level="medium",
        task=("For one transformer layer split over t GPUs with Megatron's tensor parallelism, return the "
              "seconds of its TP all-reduces over the seconds of its compute, forward and backward of one "
              "microbatch, by the step model's rule (alpha-beta rings, nothing hidden)."),
        hint=("Two times, one GPU, one layer, one microbatch. Compute: the layer's FLOPs forward and backward "
              "(its weights and attention's scores), split t ways, at the matmul rate. Traffic: how many "
              "all-reduces of the activations per layer, forward and backward, and what one costs in a ring of t."),
        more_hints=("Compute: (6 P + 12 s h) FLOPs per token, b s tokens, over t GPUs. Traffic: 2 all-reduces "
                    "forward (after attention, after the MLP) and 2 backward, each of the b s h bf16 activations "
                    "(2 bytes a value): 2 (t - 1) ring steps of alpha, and 2 (t - 1) / t of the bytes over the link.",
                    "compute = (6 * layer_params + 12 * seq * dim) * micro_batch * seq / t / matmul_flops; "
                    "traffic = 4 * (2 * (t - 1) * latency_s + 2 * (t - 1) / t * 2 * micro_batch * seq * dim / "
                    "link_bytes_per_s); return traffic / compute (0 at t = 1)."),
        checks=("four layers and degrees in one process (t = 3, 4, 8 and 1, on H100 and B200 figures), within 1e-9 "
                "of the rule written out in the checker (held against stepmodel's tp_seconds and flops' "
                "training_flops in the tests); a wrong ratio is explained by the typical mistakes that give it "
                "(the backward forgotten on one side, attention's FLOPs, the compute not split by t, the "
                "(t - 1) / t, the all-reduce's 2, the latencies, 4 bytes or bits for bf16); "
                "ddp_tutorial.performance is refused"),
        worker=tp_comm_to_compute_worker, world_sizes=(1,), init_process_group=False),
    Exercise(
        name="tp_limit", number="23.7", lesson=23, notebook="23_how_fast.ipynb",
        title="the TP degree past which a layer is communication-bound on NVLink", level="medium",
        task=("Return the largest tensor-parallel degree t of one node (1 to 8, dividing the heads) for which a "
              "Megatron layer's TP traffic takes at most its compute (23.6's ratio at most 1)."),
        hint=("23.6's ratio grows with t: the compute shrinks as 1 / t, the traffic grows. Which t may you "
              "try, and which one do you return?"),
        more_hints=("t from 1 to 8 (one node: TP stays on NVLink), only those that divide heads; the largest "
                    "whose traffic is at most its compute. Paste your tp_comm_to_compute above and call it.",),
        checks=("three layers in one process (limits 4 and 6 on B200 and H100 figures, 8 for a wider layer), "
                "exactly, against 23.6's rule written out in the checker; a wrong degree is explained by the "
                "single typical mistakes whose limit it is (23.6's, a t that does not divide the heads, a t past "
                "8, the first t that is communication-bound); ddp_tutorial.performance is refused"),
        worker=tp_limit_worker, world_sizes=(1,), init_process_group=False),
]
