"""torch's own context parallelism, read from the installed torch and called as torchtitan does (``20_long_sequences``).

``torch.distributed.tensor.experimental.context_parallel(mesh, buffers=..., buffer_seq_dims=...,
no_restore_buffers=...)`` is a context manager: it shards each buffer (q, k, v, or the inputs,
labels and position tables a model uses) along its sequence dimension in place, and while it is
open it replaces the *fused CUDA* SDPA kernels (flash, memory-efficient, cuDNN, and their
backwards) by ring versions; ``context_parallel_unshard`` puts an output back together. Its
defaults are not section 2's ring:

- ``rotate_method`` is ``ALL_GATHER``: every rank **all-gathers** K/V and computes its queries
  against the chunks (Llama 3's choice, Dubey et al. 2024, section 3.3.2: with grouped-query
  attention K/V are small, and document masks are easy); ``set_rotate_method("alltoall")``
  passes K/V from rank to rank instead, a ring;
- ``enable_load_balance`` is on: the sequence is laid out head-tail (rank ``r`` holds chunks
  ``r`` and ``2N - 1 - r``, ``zigzag``'s layout);
- ``convert_to_f32`` is on: the partial outputs and lse are merged in float32.

torchtitan turns it on with ``context_parallel_degree`` (``--parallelism.context_parallel_degree``).
On a CPU none of the fused kernels exist, so ``torch_cp_worker`` says so instead of running.

    torchrun --nproc-per-node=2 -m ddp_tutorial.context_parallel.torch_cp   # on GPUs: equal to SDPA
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist

from ddp_tutorial.env import distributed
from ddp_tutorial.launch.errors import UsageParser, check_world_size, exit_on_interrupt

__all__ = ["torch_cp_options", "cp_dispatched_ops", "torch_cp_worker", "NO_GPU", "main"]

PROG = "python -m ddp_tutorial.context_parallel.torch_cp"
SEQ = 64  # the sequence torch_cp_worker shards: 2 chunks per rank, head-tail (enable_load_balance)
NO_GPU = "no GPU here: torch's context_parallel replaces only the fused CUDA SDPA kernels; nothing to run on a CPU"


def cp_module():  # noqa: ANN201  (a module: torch moved it, _attention.py re-exports it from torch 2.10)
    from torch.distributed.tensor.experimental import _attention

    return sys.modules[_attention._cp_options.__class__.__module__]


def torch_cp_options() -> dict[str, object]:
    """The installed torch's context-parallel defaults, read from its ``_cp_options``."""
    options = cp_module()._cp_options
    return {"rotate_method": options.rotate_method.name, "enable_load_balance": options.enable_load_balance,
            "convert_to_f32": options.convert_to_f32}


def cp_dispatched_ops() -> list[str]:
    """The aten ops context parallelism replaces (torch's own table), without the ``aten.`` and ``.default``."""
    module = cp_module()
    table = getattr(module, "custom_ops", None) or module.customized_ops  # renamed after torch 2.9
    return sorted(str(op).split(".")[1] for op in table)


def torch_cp_worker(rank: int, world_size: int, seq: int = SEQ) -> dict:
    """Causal SDPA under ``context_parallel`` on a 1-D mesh of CUDA ranks, unsharded and compared with
    SDPA on the whole sequence (bf16, within 2e-2). On a CPU: ``{"line": NO_GPU}``."""
    if not torch.cuda.is_available():
        return {"line": NO_GPU}
    from torch.distributed.tensor import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel
    from torch.distributed.tensor.experimental._attention import context_parallel_unshard, set_rotate_method

    mesh = init_device_mesh("cuda", (world_size,))
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(2, 4, seq, 64, generator=gen, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    lines = []
    for method in ("allgather", "alltoall"):
        set_rotate_method(method)
        cq, ck, cv = q.clone(), k.clone(), v.clone()
        with context_parallel(mesh, buffers=[cq, ck, cv], buffer_seq_dims=[2, 2, 2], no_restore_buffers={cq, ck, cv}):
            local = torch.nn.functional.scaled_dot_product_attention(cq, ck, cv, is_causal=True)
            held = tuple(cq.shape)
        (out,) = context_parallel_unshard(mesh, [local], [2])
        ok = (out.float() - want.float()).abs().max().item() < 2e-2
        lines.append(f"{method}: each rank held q {held} of {tuple(q.shape)}; unsharded output "
                     f"{'equals' if ok else 'DIFFERS FROM'} SDPA on the whole sequence (bf16, 2e-2)")
    set_rotate_method("allgather")  # torch's default back
    return {"line": "\n".join(lines)}


def main(argv: list[str] | None = None) -> None:
    parser = UsageParser(prog=PROG, description=__doc__.splitlines()[0])
    parser.parse_args(argv)

    def fits(world_size: int) -> None:  # load balancing cuts the sequence into 2 chunks per rank
        if SEQ % (2 * world_size):
            raise ValueError(f"a sequence of {SEQ} does not split into 2 chunks per rank over {world_size} ranks")

    # Every rank would fail alike (on GPUs, inside context_parallel): said once, before any group.
    check_world_size(PROG, fits, advice="start it with torchrun --nproc-per-node=2 or 4")
    print(f"torch {torch.__version__}: context_parallel defaults {torch_cp_options()}")
    with exit_on_interrupt(PROG, "nothing was saved; run it again"), distributed() as (info, _):
        result = torch_cp_worker(info.rank, info.world_size)
        if info.is_main:
            print(result["line"])
        if "DIFFERS" in result["line"]:
            raise SystemExit(1)
        dist.barrier()

if __name__ == "__main__":
    main()
