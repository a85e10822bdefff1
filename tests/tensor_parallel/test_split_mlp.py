"""Lesson 15: tensor parallelism by hand, DTensor placements, parallelize_module and a 2-D mesh.

Every split is compared with one process running the unsplit ToyModel (or, for the
placements, with ``torch.chunk`` on the whole tensor), to ``TOLERANCE``: float32 sums in
another order differ in their last digit.

Covers ``ddp_tutorial.tensor_parallel.split_mlp``, ``ddp_tutorial.tensor_parallel.device_mesh``,
``ddp_tutorial.plots.meshes``.
"""

from __future__ import annotations

import pytest
import torch

from ddp_tutorial.launch import spawn, torchrun
from ddp_tutorial.tensor_parallel.device_mesh import (
    chunk_block,
    dtensor_worker,
    local_block,
    mesh_2d_worker,
    parallelize_worker,
    train_one_process,
)
from ddp_tutorial.tensor_parallel.split_mlp import (
    TOLERANCE,
    compare,
    expected_shard,
    hand_tp_worker,
    one_process,
    shard_range,
)

# ---------------------------------------------------------------- pure: who holds what

@pytest.mark.parametrize("size", [0, 1, 5, 7, 8])
@pytest.mark.parametrize("parts", [1, 2, 3, 4])
def test_chunk_block_cuts_as_torch_chunk_does(size, parts):
    pieces = list(torch.arange(size).chunk(parts)) if size else []
    pieces += [torch.arange(0)] * (parts - len(pieces))  # chunk returns fewer pieces; DTensor pads with empty ones
    for index in range(parts):
        length, offset = chunk_block(size, index, parts)
        assert length == len(pieces[index])
        if length:
            assert offset == pieces[index][0].item()


def test_shard_range_refuses_an_uneven_split():
    assert shard_range(8, 1, 4) == slice(2, 4)
    with pytest.raises(ValueError, match="10 units do not split evenly over 4"):
        shard_range(10, 0, 4)


def test_expected_shard_cuts_net1_rows_and_net2_columns():
    w1, w2, b2 = torch.arange(80).reshape(8, 10), torch.arange(40).reshape(5, 8), torch.arange(5)
    assert torch.equal(expected_shard("net1.weight", w1, 1, 2), w1[4:])
    assert torch.equal(expected_shard("net2.weight", w2, 1, 2), w2[:, 4:])
    assert torch.equal(expected_shard("net2.bias", b2, 1, 2), b2)


# ---------------------------------------------------------------- by hand

@pytest.mark.parametrize("world_size", [2, 4])
def test_hand_made_split_equals_one_process_forward_and_backward(world_size):
    results = spawn(hand_tp_worker, world_size, timeout=60, quiet=True)
    diff = compare(results, one_process())  # outputs, input gradients, every gradient shard
    assert max(diff.values()) < TOLERANCE, diff
    for r in results:  # Megatron: one all-reduce in forward (g), one in backward (f)
        assert r["collectives"] == {"forward": 1, "backward": 1}
        assert r["grads"]["net1.weight"].shape == (8 // world_size, 10)
        assert r["grads"]["net2.weight"].shape == (5, 8 // world_size)


def test_without_f_each_rank_holds_a_partial_input_gradient():
    results = spawn(hand_tp_worker, 2, args=(8, 4, 0, False), timeout=60, quiet=True)
    reference = one_process()
    diff = compare(results, reference)
    assert diff["output"] < TOLERANCE and diff["grads"] < TOLERANCE  # the weights do not notice
    assert diff["input_grad"] > 1e-3  # but what flows to an earlier layer is wrong ...
    summed = results[0]["input_grad"] + results[1]["input_grad"]
    assert torch.allclose(summed, reference["input_grad"], atol=TOLERANCE)  # ... by exactly f's all-reduce
    assert all(r["collectives"] == {"forward": 1, "backward": 0} for r in results)


# ---------------------------------------------------------------- DTensor and parallelize_module

@pytest.mark.parametrize("world_size, shape", [(2, (4, 6)), (3, (5, 7))])
def test_dtensor_placements_give_the_pieces_torch_chunk_gives(world_size, shape):
    full = torch.arange(shape[0] * shape[1], dtype=torch.float32).reshape(shape)
    results = spawn(dtensor_worker, world_size, args=(shape,), timeout=60, quiet=True)
    for rank, r in enumerate(results):
        for name, dim in (("S(0)", 0), ("S(1)", 1)):
            pieces = list(full.chunk(world_size, dim))
            want = pieces[rank] if rank < len(pieces) else full.narrow(dim, 0, 0)
            piece = r["pieces"][name]
            assert torch.equal(torch.tensor(piece["local"]).reshape(want.shape), want)
            assert piece["shape"] == tuple(want.shape)
        assert r["pieces"]["R"]["shape"] == shape and r["pieces"]["R"]["offset"] == (0, 0)
        assert all(p["round_trip"] for p in r["pieces"].values())


def test_placements_on_a_2d_mesh_give_the_pieces_of_nested_chunks():
    import tensor_parallel_workers as w

    full = torch.arange(35, dtype=torch.float32).reshape(5, 7)
    results = spawn(w.placed_pieces, 4, timeout=60, quiet=True)
    for rank, pieces in enumerate(results):
        for (mesh_shape, names), piece in zip(w.LAYOUTS, pieces):
            want = full  # cut by each mesh dimension in turn, as torch.chunk cuts
            for name, index, parts in zip(names, piece["coordinate"], mesh_shape):
                if name != "R":
                    dim = int(name[2:-1])
                    chunks = list(want.chunk(parts, dim))
                    want = chunks[index] if index < len(chunks) else want.narrow(dim, 0, 0)
            assert torch.equal(piece["local"].reshape(want.shape), want), (rank, names)
            shape, _ = local_block((5, 7), names, piece["coordinate"], mesh_shape)
            assert shape == tuple(want.shape), (rank, names)


def test_parallelize_module_equals_the_hand_made_split():
    by_hand = spawn(hand_tp_worker, 2, timeout=60, quiet=True)
    by_torch = spawn(parallelize_worker, 2, timeout=60, quiet=True)
    for hand, torch_ in zip(by_hand, by_torch):
        # not bit for bit: DTensor may add the bias as b/n on every rank before the all-reduce
        assert torch.allclose(hand["output"], torch_["output"], atol=TOLERANCE)
        assert torch.allclose(hand["input_grad"], torch_["input_grad"], atol=TOLERANCE)
        for name, grad in hand["grads"].items():
            assert grad.shape == torch_["grads"][name].shape
            assert torch.allclose(grad, torch_["grads"][name], atol=TOLERANCE), name
        assert torch_["collectives"] == hand["collectives"] == {"forward": 1, "backward": 1}
        assert {n: b["placements"] for n, b in torch_["blocks"].items()} == {
            "net1.weight": ["S(0)"], "net1.bias": ["S(0)"], "net2.weight": ["S(1)"], "net2.bias": ["R"]}
    assert max(compare(by_torch, one_process()).values()) < TOLERANCE


# ---------------------------------------------------------------- 2-D: data parallel x tensor parallel

def test_2d_mesh_training_equals_one_process_on_the_global_batch():
    steps = 3
    results = spawn(mesh_2d_worker, 4, args=(steps,), timeout=90, quiet=True)
    reference = train_one_process(steps, global_batch=8)
    for rank, r in enumerate(results):
        assert r["coordinate"] == {"dp": rank // 2, "tp": rank % 2}
        assert r["tp_ranks"] == [2 * (rank // 2), 2 * (rank // 2) + 1] and r["dp_ranks"] == [rank % 2, rank % 2 + 2]
        for name, value in reference["state"].items():
            assert torch.allclose(r["state"][name], value, atol=TOLERANCE), (rank, name)
        assert all(abs(a - b) < TOLERANCE for a, b in zip(r["losses"], reference["losses"]))
        assert r["blocks"]["net1.weight"]["offset"] == (4 * (rank % 2), 0)  # replicas over dp: same piece
    assert reference["losses"][-1] < reference["losses"][0]  # it did train


def test_2d_mesh_refuses_a_world_the_mesh_does_not_cover():
    with pytest.raises(ValueError, match="tensor-parallel size of 2 does not divide world_size=3"):
        mesh_2d_worker(0, 3)


# ---------------------------------------------------------------- the picture and the shell

def test_picture_labels_each_block_with_the_ranks_holding_it():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ddp_tutorial.plots import plot_tensor_blocks

    def block(shape, offset):
        return {"w": {"shape": shape, "offset": offset, "global_shape": (4, 6), "placements": ["S(1)"]}}

    # ranks 0, 2 hold the left half, 1, 3 the right one (a 2 x 2 mesh sharding over tp)
    blocks = [block((4, 3), (0, 0)), block((4, 3), (0, 3)), block((4, 3), (0, 0)), block((4, 3), (0, 3))]
    (ax,) = plot_tensor_blocks(blocks, ["w"], label="mesh: ")
    assert sorted(t.get_text() for t in ax.texts) == ["ranks 0, 2\n4 x 3", "ranks 1, 3\n4 x 3"]
    assert ax.get_title() == "mesh: w (4 x 6)\n[S(1)]"
    plt.close("all")


@pytest.mark.slow  # a torchrun command: make test-slow (CI)
def test_module_runs_under_torchrun_and_prints_ok():
    result = torchrun("ddp_tutorial.tensor_parallel.split_mlp", nproc_per_node=2, timeout=90)
    assert "OK: ToyModel split over 2 rank(s)" in result.output, result.output
