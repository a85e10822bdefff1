"""ddp_tutorial/exercises/watching.py: each instrument on small torch code whose answer is known another way."""

import pytest
import torch
import torch.distributed as dist

from ddp_tutorial.exercises.watching import (
    Allocation,
    LargestTensor,
    bytes_alive,
    keeping,
    routed_counts,
    wrong_mesh_device,
    wrong_split,
)

FLOAT32 = 4  # bytes per element, written down rather than asked of torch


def test_a_tensor_kept_past_the_call_is_alive_and_one_freed_is_not():
    cache = []
    with keeping() as kept:
        cache.append(torch.ones(4, 4))  # kept: 16 elements of 4 bytes
        total = torch.full((3, 3), 2.0).sum()  # the 3 x 3 is freed when sum returns
    assert bytes_alive(kept, [total], patience=0) == 16 * FLOAT32
    assert kept.alive([total], patience=0) == [(64, False)]  # kept outside autograd
    cache.clear()
    assert bytes_alive(kept, [total], patience=0) == 0


def test_what_autograd_saves_for_backward_is_told_apart():
    a = torch.randn(4, 4, requires_grad=True)  # made before: not counted
    with keeping() as kept:
        out = (a * 2).sin()  # sin saves its input, the 4 x 4 product, for backward
    assert kept.alive([out], patience=0) == [(16 * FLOAT32, True)]
    out.sum().backward()  # backward frees what was saved
    del out
    assert bytes_alive(kept, patience=0) == 0


def test_at_least_leaves_small_storages_out_and_besides_the_callers_own():
    with keeping() as kept:
        big, small = torch.zeros(4, 4), torch.zeros(2, 2, dtype=torch.float64)
    assert bytes_alive(kept, patience=0) == 16 * FLOAT32 + 4 * 8
    assert bytes_alive(kept, at_least=64, patience=0) == 64
    assert bytes_alive(kept, [big, small], patience=0) == 0


def test_a_storage_resized_to_nothing_counts_as_freed():
    with keeping() as kept:
        full = torch.ones(8)
    full.untyped_storage().resize_(0)  # FSDP's way of freeing a gathered weight in place
    assert bytes_alive(kept, patience=0) == 0


def test_nothing_is_watched_after_the_block():
    with keeping() as kept:
        pass
    later = torch.ones(4)
    assert bytes_alive(kept, patience=0) == 0 and later.sum() == 4


def test_the_largest_allocation_of_a_matmul_is_its_output():
    a, b = torch.randn(3, 5), torch.randn(5, 7)
    with LargestTensor() as watch:
        small = a[:, :2] * 1.0  # 3 x 2: an allocation, smaller than the product's
        out = a @ b
    assert watch.largest == Allocation("mm", (3, 7), 3 * 7 * FLOAT32)
    assert out.shape == (3, 7) and small.shape == (3, 2)


def test_cat_is_an_allocation_and_views_and_in_place_results_are_not():
    x = torch.randn(2, 3, dtype=torch.float64)
    with LargestTensor() as views:
        x.t().t().view(6)
        x.add_(1)
    assert views.largest is None
    with LargestTensor() as copy:
        x.t().reshape(6)  # not contiguous: reshape copies
    assert copy.largest == Allocation("clone", (3, 2), 6 * 8)
    with LargestTensor() as watch:
        torch.cat([x, x])
    assert watch.largest == Allocation("cat", (4, 3), 12 * 8)


def test_flag_picks_the_first_output_it_holds_for_views_included():
    x = torch.randn(2, 5)
    with LargestTensor(flag=lambda t: t.shape == (5, 2)) as watch:
        x.t()
        x.t().contiguous()
    assert watch.flagged == Allocation("t", (5, 2), 10 * FLOAT32)
    with LargestTensor(flag=lambda t: t.dim() == 4) as none:
        x.sum()
    assert none.flagged is None and none.largest == Allocation("sum", (), FLOAT32)


def test_routed_counts_against_bincount():
    gen = torch.Generator().manual_seed(0)
    n = 3
    destinations = [torch.randint(n, (rows,), generator=gen).tolist() for rows in (5, 0, 8)]  # uneven, one empty
    counts = routed_counts(destinations, n)
    assert counts == [torch.bincount(torch.tensor(d, dtype=torch.long), minlength=n).tolist() for d in destinations]
    assert counts[1] == [0, 0, 0]


def test_a_rank_that_receives_nothing_is_right_to_receive_nothing():
    destinations = [[0, 0, 1], [1, 0], [0]]  # nobody sends rank 2 a row
    received_by_2 = [row[2] for row in routed_counts(destinations, 3)]
    assert received_by_2 == [0, 0, 0]
    assert wrong_split(2, [0, 0, 0], received_by_2) is None
    wrong = wrong_split(2, [1, 0, 0], received_by_2)
    assert wrong == ("rank 2 received [1, 0, 0] rows from ranks 0..2 where the routing sends [0, 0, 0]: send each "
                     "row only to its destination, once")


def test_every_row_everywhere_is_named_an_all_gather_in_disguise():
    destinations = [[1, 1, 0, 1], [0, 1]]  # uneven: 4 rows and 2
    want = [row[0] for row in routed_counts(destinations, 2)]  # what rank 0 should get: [1, 1]
    held = [len(d) for d in destinations]  # every row of every rank
    wrong = wrong_split(0, held, want, every=held, who="compute")
    assert "rank 0's compute received [4, 2] rows from ranks 0..1 where the routing sends [1, 1]" in wrong
    assert "all-gather in disguise" in wrong and "n times the traffic" in wrong
    total = wrong_split(0, [6], [2], every=[6], sent=True, routing="the routing with capacity")
    assert total.startswith("rank 0 sent 6 rows where the routing with capacity sends 2: every rank's rows")
    assert wrong_split(0, [0, 0], [0, 0], every=[0, 0]) is None  # no row anywhere: nothing to gather


def test_advice_elements_and_bad_input():
    assert wrong_split(1, [2, 3], [3, 2], advice="output_split_sizes are the counts the peers sent").endswith(
        "where the routing sends [3, 2]: output_split_sizes are the counts the peers sent")
    assert wrong_split(0, [2, 1], [2, 1], elements=9, width=3) is None
    assert wrong_split(0, [2, 1], [2, 1], elements=8, width=3) == (
        "rank 0 received 8 elements for 3 rows of 3: each row whole and once, 9 elements")
    with pytest.raises(ValueError, match="one count per peer"):
        wrong_split(0, [1, 2], [3])
    with pytest.raises(ValueError, match="source rank 1 routes a row to rank 2, outside 0..1"):
        routed_counts([[0], [2]], 2)


@pytest.fixture
def world_of_one():
    """A gloo world of one process, in this one (a HashStore: no port), torn down after."""
    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_a_mesh_is_judged_by_the_device_type_it_was_made_with(world_of_one):
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("dp",))
    assert wrong_mesh_device(mesh, "cpu") is None
    wrong = wrong_mesh_device(mesh, "cuda")
    assert wrong.startswith("the mesh was made for device type 'cpu', but this rank's tensors live on 'cuda'")
    assert "init_device_mesh('cuda', ...)" in wrong
    assert wrong_mesh_device([0, 1], "cpu") == "list is not a DeviceMesh: it has no device type"
