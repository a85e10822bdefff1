"""DCP: a sharded checkpoint saved on 4 ranks loads on 3 (uneven shards), 2 and 1 to identical values; one-file export."""

from __future__ import annotations

import pytest

from ddp_tutorial.launch import spawn
from ddp_tutorial.models import TinyTransformer
from ddp_tutorial.sharding.sharded_checkpoint import (
    export_single_file,
    load_and_compare,
    local_elements,
    train_and_save,
)


@pytest.mark.slow  # make test stays under 12 minutes; make test-slow and CI run it
@pytest.mark.timeout(200)
def test_save_on_4_load_on_2_and_1_and_export(tmp_path):
    folder = str(tmp_path / "checkpoint")
    saved = spawn(train_and_save, 4, args=(folder,), timeout=120)
    assert all(set(s) == set(saved[0]) for s in saved)  # every rank saw the same full values
    saved = saved[0]
    model = TinyTransformer()
    names = [n for n, _ in model.named_parameters()]
    assert {f"model.{n}" for n in names} <= set(saved)
    assert {f"optim.state.{n}.exp_avg" for n in names} <= set(saved)  # Adam's state, keyed by name
    assert len(list(tmp_path.glob("checkpoint/*.distcp"))) == 4  # one file per saving rank
    numel = sum(p.numel() for p in model.parameters())
    for world_size in (3, 2, 1):  # 3: FSDP2's dim-0 shards are uneven (32 rows as 11, 11, 10)
        for rank, r in enumerate(spawn(load_and_compare, world_size, args=(folder, saved), timeout=120)):
            assert r["same keys"] and r["difference"] == 0, (world_size, rank, r)
            # resharded: each rank holds its rows of every parameter, torch.chunk's cut of dim 0
            chunks = [p.detach().chunk(world_size) for p in model.parameters()]
            mine = sum(c[rank].numel() for c in chunks if rank < len(c))
            assert r["local elements"] == mine == sum(local_elements(p.shape, rank, world_size)
                                                       for p in model.parameters())
            if world_size < 3:
                assert r["local elements"] == numel // world_size
            # full_state_dict + cpu_offload: whole tensors on rank 0 only, equal to what was saved
            assert r["full on this rank"] == (len(names) if rank == 0 else 0) and r["full difference"] == 0
    exported = export_single_file(folder, str(tmp_path / "one.pt"))
    assert sorted(exported) == sorted(saved)
    assert all((exported[k] - saved[k]).abs().max().item() == 0 for k in saved)
