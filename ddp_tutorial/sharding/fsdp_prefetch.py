"""FSDP2's prefetch and reshard controls, counted: which all-gathers run, when, and over how many ranks (``18_zero3_and_checkpoints``).

Every setting below changes *when* a block's weights are gathered or *how many* gathers a step
makes, never the numbers: each trains to the same bits as the default. What each changes is
counted from FSDP2's own unshards (``recorded_unshards``), with the group size of each gather:

- default: every block ``reshard_after_forward=True`` (gathered in forward, freed, gathered
  again in backward); the root's is left unset, which FSDP2 turns into ``False`` (backward
  needs the head first). The next block's gather in backward is issued one ahead (implicit);
- ``reshard_after_forward=False`` for the last block too (torchtitan's default policy: backward
  starts there, so re-gathering it at once is wasted): one gather fewer per step;
- ``True`` at the root as well: one more (the root's weights gathered again in backward);
- ``False`` everywhere: no gather in backward at all, and no memory saved for the parameters
  between forward and backward (ZeRO-2's parameters);
- an int ``k`` (4 ranks, ``k = 2``): after forward each block keeps a shard of 1/k, so the
  backward's gathers run over groups of k ranks (inside a node) instead of all N;
- ``set_modules_to_forward_prefetch``: block i issues the gathers of the blocks after it as
  soon as its own are copied out, before it computes (two ahead: more memory in flight);
- ``unshard(async_op=True)`` on the root: its gather runs while the batch is prepared.

    torchrun --nproc-per-node=4 -m ddp_tutorial.sharding.fsdp_prefetch
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup

from ddp_tutorial.env import distributed, rank_device
from ddp_tutorial.launch.verdict import verdict
from ddp_tutorial.models import TinyTransformer, token_batch
from ddp_tutorial.sharding.sharded_resume import digest
from ddp_tutorial.sharding.zero3_train import mixed_precision_step

__all__ = ["SETTINGS", "recorded_unshards", "build", "run_setting", "prefetch_report"]

# name -> (reshard_after_forward of each block, of the root (None: FSDP2 decides), forward prefetch, async root)
SETTINGS = {
    "default": ((True, True), None, 0, False),
    "last block kept (torchtitan)": ((True, False), None, 0, False),
    "root resharded too": ((True, True), True, 0, False),
    "never resharded": ((False, False), False, 0, False),
    "reshard to 2 ranks": ((2, 2), None, 0, False),
    "forward prefetch, 2 ahead": ((True, True), None, 2, False),
    "root unshard(async_op=True)": ((True, True), None, 0, True),
}


@contextmanager
def recorded_unshards(events: list) -> Iterator[list]:
    """Append ``("all-gather", module, ranks)`` to ``events`` for each all-gather FSDP2 issues.

    Reads FSDP2's private ``FSDPParamGroup.unshard`` (the one place every gather starts: forward,
    backward, prefetch, explicit ``unshard``); an unshard that finds the weights already there or
    in flight returns without a collective and is not counted. Only to count: restored on exit.
    """
    original = FSDPParamGroup.unshard

    def unshard(self: FSDPParamGroup, async_op: bool = False) -> None:
        pending = self._all_gather_result
        original(self, async_op)
        if pending is None and self._all_gather_result is not None:
            events.append(("all-gather", self._module_fqn or "(root)", self._all_gather_process_group.size()))

    FSDPParamGroup.unshard = unshard
    try:
        yield events
    finally:
        FSDPParamGroup.unshard = original


def build(blocks: tuple, root: bool | None, ahead: int) -> TinyTransformer:
    """Seed 0's ``TinyTransformer`` (one block per setting), each block ``fully_shard`` with its setting, then the root."""
    torch.manual_seed(0)
    model = TinyTransformer(layers=len(blocks)).to(rank_device())
    mesh = init_device_mesh(rank_device().type, (dist.get_world_size(),))
    for block, setting in zip(model.blocks, blocks):
        fully_shard(block, mesh=mesh, reshard_after_forward=setting)
    fully_shard(model, mesh=mesh, **({} if root is None else {"reshard_after_forward": root}))
    if ahead:
        for i, block in enumerate(model.blocks):
            block.set_modules_to_forward_prefetch(list(model.blocks[i + 1:i + 1 + ahead]))
    return model


def run_setting(rank: int, world_size: int, name: str, num_steps: int = 2) -> dict:
    """Train ``SETTINGS[name]`` for ``num_steps`` SGD steps; the last step's events in order (gathers and
    each block's forward), the gathers per phase and their group sizes, the weights' digest, and their
    largest gap from one process trained on the global batch."""
    blocks, root, ahead, async_root = SETTINGS[name]
    model = build(blocks, root, ahead)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    events: list = []
    for i, block in enumerate(model.blocks):
        block.register_forward_pre_hook(lambda *_, i=i: events.append(("computes", f"blocks.{i}", None)))
    with recorded_unshards(events):
        for step in range(num_steps):
            events.clear()
            if async_root:
                handle = model.unshard(async_op=True)  # the root's gather starts now ...
            events.append(("batch ready", "", None))
            tokens, targets = token_batch(step, world_size, rank, device=rank_device())  # ... and overlaps this
            if async_root:
                handle.wait()
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(tokens), targets)
            events.append(("backward starts", "", None))
            loss.backward()
            optimizer.step()
    torch.manual_seed(0)
    single = TinyTransformer(layers=len(blocks)).to(rank_device())
    reference = torch.optim.SGD(single.parameters(), lr=0.1)
    for step in range(num_steps):
        mixed_precision_step(single, reference, *token_batch(step, world_size, device=rank_device()), None)
    gap = max((p.full_tensor() - q.detach()).abs().max().item() for p, q in zip(model.parameters(), single.parameters()))
    backward = events.index(("backward starts", "", None))
    gathers = [(i < backward, ranks) for i, (kind, _, ranks) in enumerate(events) if kind == "all-gather"]
    return {"events": events, "forward gathers": sum(f for f, _ in gathers),
            "backward gathers": sum(not f for f, _ in gathers),
            "backward group sizes": sorted({r for f, r in gathers if not f}), "digest": digest(model), "gap": gap}


def prefetch_report(rank: int, world_size: int, names: tuple = tuple(SETTINGS)) -> dict:
    """``run_setting`` for each name (one launch); the int setting needs a world size it divides."""
    result = {name: run_setting(rank, world_size, name) for name in names}
    dist.barrier()  # see fsdp.gradients_vs_ddp: gloo and FSDP2's last collectives at exit
    return result


def main() -> None:
    with distributed() as (info, _):
        names = tuple(n for n in SETTINGS if info.world_size == 4 or "reshard to" not in n)
        report = prefetch_report(info.rank, info.world_size, names)
        if info.is_main:
            for name, r in report.items():
                print(f"{name:<30} all-gathers per step: forward {r['forward gathers']}, backward "
                      f"{r['backward gathers']} over {r['backward group sizes']} ranks; weights {r['digest']}")
        same = len({r["digest"] for r in report.values()}) == 1
        verdict(same, "every setting trains to the same bits", show=info.is_main)


if __name__ == "__main__":
    main()
