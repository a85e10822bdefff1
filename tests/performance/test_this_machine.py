"""``performance.this_machine``: the measured machine as the step model's input, each piece checked another way.

The FLOPs of each layout's step against ``torch.utils.flop_counter.FlopCounterMode`` on the layers one
rank runs; the bytes against the tensors themselves; the alpha-beta conversion against a synthetic line.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from ddp_tutorial.bench.collective_bw import fit_alpha_beta
from ddp_tutorial.models import DeepMLP
from ddp_tutorial.performance.stepmodel import collective_seconds
from ddp_tutorial.performance.this_machine import (
    capstone_step,
    cpu_hardware,
    layout_plan,
    link_from_fit,
    predict_plan,
)

SIZES = [(m.in_features, m.out_features) for m in DeepMLP().net if isinstance(m, nn.Linear)]


def counted(model: nn.Module, x: torch.Tensor) -> int:
    """FLOPs of one forward and backward, as torch's counter sees the kernels."""
    with FlopCounterMode(display=False) as counter:
        model(x).square().mean().backward()
    return counter.get_total_flops()


def stack(sizes: list[tuple[int, int]]) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, o in sizes:
        layers += [nn.Linear(i, o), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


@pytest.mark.parametrize("n", [2, 4])
def test_a_synthetic_line_is_fitted_and_given_back_by_the_model(n):
    alpha, algbw = 40e-6, 2.5e9
    nbytes = [4096.0, 65536.0, 1048576.0, 4194304.0]
    fitted_alpha, fitted_bw = fit_alpha_beta(nbytes, [alpha + b / algbw for b in nbytes])
    assert fitted_alpha == pytest.approx(alpha, rel=1e-9) and fitted_bw == pytest.approx(algbw, rel=1e-9)
    latency, link = link_from_fit(fitted_alpha, fitted_bw, n)
    for b in nbytes:
        assert collective_seconds("all_reduce", b, n, link, latency) == pytest.approx(alpha + b / algbw, rel=1e-9)


def test_ddp_and_fsdp_flops_are_what_one_rank_runs():
    rows = 32
    reference = counted(DeepMLP(), torch.randn(rows, SIZES[0][0]))
    assert layout_plan("DDP", SIZES, 2 * rows).flops == reference
    assert layout_plan("FSDP2", SIZES, 2 * rows).flops == reference


def test_tp_flops_are_those_of_the_half_width_layers_a_rank_holds():
    rows = 16
    # what a rank holds: layers 1 and 3 keep half their outputs (columns), 2 and 4 half their inputs (rows)
    held = [SIZES[0], (512, 256), (256, 512), (512, 256), (256, 256), SIZES[5]]
    assert layout_plan("TP", SIZES, rows).flops == counted(stack(held), torch.randn(rows, 256))


def test_pp_flops_are_the_busier_stage_and_its_sends_the_boundary_activations():
    rows, micro = 16, 4
    first, second = stack(SIZES[:3]), stack(SIZES[3:])
    boundary = torch.relu(first(torch.randn(rows // micro, 256)))
    stage_flops = [counted(first, torch.randn(rows, 256)),
                   counted(second, torch.randn(rows, 512, requires_grad=True))]
    plan = layout_plan("PP", SIZES, rows, micro_batches=micro)
    assert plan.flops == max(stage_flops)
    assert [c[1] for c in plan.comms] == [boundary.nbytes] * (2 * micro)  # forward and back per microbatch


def test_ddp_and_fsdp_move_the_models_parameter_bytes():
    params = sum(p.nbytes for p in DeepMLP().parameters())
    assert layout_plan("DDP", SIZES, 64).comms == [("all_reduce", params, 2, True)]
    assert [(k, b) for k, b, _, _ in layout_plan("FSDP2", SIZES, 64).comms] == \
        [("all_gather", params), ("all_gather", params), ("reduce_scatter", params)]


def test_tp_all_reduces_each_pairs_output_forward_and_its_input_gradient_backward():
    rows = 8
    comms = layout_plan("TP", SIZES, rows).comms
    assert [b for _, b, _, _ in comms] == [rows * 512 * 4, rows * 512 * 4, rows * 256 * 4, rows * 512 * 4]
    assert {(k, n, hidden) for k, _, n, hidden in comms} == {("all_reduce", 2, False)}


def test_prediction_hides_dp_traffic_behind_compute_and_adds_the_bubble():
    fast = cpu_hardware(matmul_flops=1e10, copy_bytes_per_s=1e10, latency_s=1e-6, link_bytes_per_s=1e12)
    slow = cpu_hardware(matmul_flops=1e10, copy_bytes_per_s=1e10, latency_s=1e-6, link_bytes_per_s=1e6)
    ddp = layout_plan("DDP", SIZES, 256)
    hidden = predict_plan(ddp, fast)
    assert hidden.exposed_s == 0 and hidden.step_s == hidden.compute_s == ddp.flops / 1e10
    exposed = predict_plan(ddp, slow)
    assert exposed.exposed_s == pytest.approx(exposed.comm_s - exposed.compute_s)
    pp = predict_plan(layout_plan("PP", SIZES, 256, micro_batches=4), fast)
    assert pp.bubble_s == pytest.approx(pp.compute_s / 4)
    assert pp.step_s == pytest.approx(pp.compute_s + pp.exposed_s + pp.bubble_s)


def test_predicted_compute_follows_the_flops():
    hw = cpu_hardware(matmul_flops=1e10, copy_bytes_per_s=1e10, latency_s=1e-5, link_bytes_per_s=1e9)
    small, big = layout_plan("DDP", SIZES, 64), layout_plan("DDP", SIZES, 1024)
    assert predict_plan(big, hw).compute_s == pytest.approx(16 * predict_plan(small, hw).compute_s)


def test_the_measured_machine_is_a_hardware_with_every_figure_sourced_and_unknown_layouts_are_named():
    hw = cpu_hardware(matmul_flops=5e10, copy_bytes_per_s=2e10, latency_s=1e-4, link_bytes_per_s=1e9)
    assert hw.peak_flops == hw.achievable_flops == 5e10 and hw.nvlink_bytes_per_s == hw.network_bytes_per_s
    assert all("measured on this machine" in s for s in hw.sources.values())
    with pytest.raises(ValueError, match="no layout 'ZeRO'; choose one of DDP, FSDP2, TP, PP"):
        layout_plan("ZeRO", SIZES, 64)


def test_the_capstones_layouts_become_step_layouts_as_lesson_22_applies_them():
    from ddp_tutorial.capstone.chars import VOCAB
    from ddp_tutorial.capstone.reference import GPTRun, make_gpt

    shape, dp4 = capstone_step({"dp": 4})
    weights = dict(make_gpt(GPTRun()).named_parameters())
    linear = sum(p.numel() for n, p in weights.items() if p.dim() == 2 and "tok_embeddings" not in n)
    assert (shape.matmul_params, shape.embedding_params) == (linear, VOCAB * GPTRun().dim)
    assert (dp4.zero, dp4.value_bytes, dp4.micro_batches, dp4.micro_batch) == (3, 8, 1, 2)  # FSDP2, float64
    _, piped = capstone_step({"tp": 2, "pp": 2})
    assert (piped.zero, piped.sequence_parallel, piped.micro_batches, piped.micro_batch) == (0, True, 2, 4)
    _, ring = capstone_step({"dp": 2, "cp": 2})
    assert (ring.zero, ring.cp, ring.micro_batch) == (3, 2, 4)  # FSDP2 over dp x cp, as the capstone's dp_cp


def test_value_bytes_scale_what_a_group_sends_and_nothing_else():
    from ddp_tutorial.performance.hardware import H100
    from ddp_tutorial.performance.stepmodel import StepLayout, predict

    shape, _ = capstone_step({"dp": 4})
    hw = H100
    one = predict(shape, StepLayout(dp=4, zero=3, value_bytes=2, grad_bytes=2), hw)
    four = predict(shape, StepLayout(dp=4, zero=3, value_bytes=8, grad_bytes=8), hw)
    # ZeRO-3 over 4 ranks: a reduce-scatter of the gradients and two all-gathers of the weights, 3 (n-1) steps
    # each paying alpha, and 3 x 3/4 of the parameters' bytes over NVLink: worked out by hand
    params = shape.matmul_params + shape.embedding_params
    for step, nbytes in ((one, 2), (four, 8)):
        assert step.comm["dp"] == pytest.approx(3 * 3 * hw.latency_s + 3 * 0.75 * params * nbytes / hw.nvlink_bytes_per_s)
    assert one.compute_s == four.compute_s
