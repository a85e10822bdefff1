"""``ddp_tutorial.capstone.layout``: coordinates and groups against a second computation and torch's DeviceMesh.

The pure functions are checked against numpy's view of the same grid (``arange(n).reshape(shape)``:
a group of dimension d is a line of the array along axis d), every layout's admission against the
rules written out again, and ``build_mesh`` against what torch's own ``DeviceMesh`` says on 4 ranks.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from ddp_tutorial.capstone.layout import (
    MESH_DIMS,
    Layout,
    LayoutError,
    all_groups,
    check_layout,
    coordinates,
    group_ranks,
    layout_problems,
    layouts,
    mesh_worker,
    rank_at,
)
from ddp_tutorial.launch import spawn

SOME = [Layout(), Layout(dp=2), Layout(dp=2, tp=2, pp=2), Layout(dp=3, tp=2), Layout(tp=2, pp=2, cp=2),
        Layout(pp=3, dp=1, cp=2, tp=1), Layout(dp=2, tp=4), Layout(pp=2, dp=2, cp=2, tp=2)]


def numpy_groups(layout: Layout) -> dict[str, list[list[int]]]:
    """Each dimension's groups, as lines of the rank grid along that axis (numpy's own indexing)."""
    grid = np.arange(layout.world_size).reshape(layout.shape)
    return {d: sorted(np.moveaxis(grid, axis, -1).reshape(-1, layout.shape[axis]).tolist())
            for axis, d in enumerate(MESH_DIMS)}


@pytest.mark.parametrize("layout", SOME, ids=str)
def test_coordinates_and_groups_agree_with_numpy(layout):
    grid = np.arange(layout.world_size).reshape(layout.shape)
    for rank in range(layout.world_size):
        where = dict(zip(MESH_DIMS, (int(i) for i in np.argwhere(grid == rank)[0])))
        assert coordinates(rank, layout) == where
        assert rank_at(where, layout) == rank
        for dim, ranks in group_ranks(rank, layout).items():
            assert rank in ranks and len(ranks) == getattr(layout, dim)
            assert ranks in numpy_groups(layout)[dim]
    assert all_groups(layout) == numpy_groups(layout)


def test_tp_is_innermost_and_pp_outermost():
    layout = Layout(dp=2, tp=2, pp=2)
    assert group_ranks(0, layout) == {"pp": [0, 4], "dp": [0, 2], "cp": [0], "tp": [0, 1]}
    assert group_ranks(7, layout) == {"pp": [3, 7], "dp": [5, 7], "cp": [7], "tp": [6, 7]}


def rules_broken(layout: Layout, heads: int, layers: int, seq: int, batch: int, micro: int) -> bool:
    """The admission rules, written again without the module: does the model refuse ``layout``?"""
    replica = batch // layout.dp
    return bool(heads % layout.tp or seq % (layout.tp * layout.cp) or layers % layout.pp or batch % layout.dp
                or (layout.pp > 1 and replica % max(micro, layout.pp)))


@pytest.mark.parametrize("model", [dict(heads=4, layers=4, seq=16, global_batch=8, microbatches=2),
                                   dict(heads=6, layers=3, seq=12, global_batch=6, microbatches=3)])
def test_layouts_lists_exactly_the_admitted_ones(model):
    listed = layouts(8, **model)
    assert len(set(listed)) == len(listed)
    every = [Layout(**dict(zip(MESH_DIMS, s))) for s in itertools.product(range(1, 9), repeat=4)
             if np.prod(s) <= 8]
    args = (model["heads"], model["layers"], model["seq"], model["global_batch"], model["microbatches"])
    assert set(listed) == {lay for lay in every if not rules_broken(lay, *args)}
    assert [lay.world_size for lay in listed] == sorted(lay.world_size for lay in listed)


def test_the_course_model_admits_33_layouts_of_up_to_8_ranks():
    listed = layouts()
    assert len(listed) == 33 and Layout(dp=2, tp=2, pp=2) in listed and Layout(tp=8) not in listed
    eight = [lay for lay in listed if lay.world_size == 8]
    assert len(eight) == 18 and sum(lay.cp == 1 for lay in eight) == 8  # 8 of them without cp


def test_a_refused_layout_says_every_reason():
    problems = layout_problems(Layout(dp=3, tp=3, pp=3), 8, heads=4, layers=4, seq=16, global_batch=8)
    text = "; ".join(problems)
    assert len(problems) == 5, problems
    for words in ("= 27, but the world has 8 ranks", "tp=3 does not divide the 4 attention heads",
                  "does not divide the sequence of 16", "pp=3 does not divide the 4 layers",
                  "dp=3 does not divide the global batch"):
        assert words in text
    with pytest.raises(LayoutError, match="tp=3 does not divide"):
        check_layout(Layout(tp=3), 3)
    assert "positive" in layout_problems(Layout(dp=0))[0]
    assert check_layout(Layout(dp=2, tp=2, pp=2), 8) == Layout(dp=2, tp=2, pp=2)
    assert str(Layout(dp=2, pp=2)) == "dp2 x pp2" and str(Layout()) == "one process"


def test_build_mesh_is_what_the_pure_functions_say():
    four = [Layout(dp=2, tp=2), Layout(pp=2, cp=2), Layout(dp=4)]
    results = spawn(mesh_worker, 4, args=([vars(lay) for lay in four],), timeout=120)
    for rank, facts in enumerate(results):
        for layout, got in zip(four, facts):
            assert got["names"] == MESH_DIMS and got["shape"] == layout.shape
            assert got["coordinate"] == coordinates(rank, layout)
            assert got["groups"] == group_ranks(rank, layout)


def test_build_mesh_refuses_a_product_other_than_the_world_size():
    with pytest.raises(Exception, match="dp x tp x pp x cp = 4, but the world has 2 ranks"):
        spawn(mesh_worker, 2, args=([{"dp": 2, "tp": 2}],), timeout=60, quiet=True)
