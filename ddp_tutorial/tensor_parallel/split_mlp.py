"""Tensor parallelism by hand: one MLP split over ranks, Megatron-style (``15_tensor_parallel``).

Data parallelism (lessons 07-08) copies the whole model to every rank. Tensor parallelism
splits each weight matrix instead, so every rank holds and computes a slice of every layer.
For a two-layer MLP ``y = relu(x A) B`` (here ``ToyModel``: ``net1 -> relu -> net2``) the
Megatron-LM paper splits ``A`` by columns and ``B`` by rows:

- **column-parallel** ``net1``: rank ``r`` holds hidden units ``r*h/n .. (r+1)*h/n``; it computes
  its slice of the hidden activations from the whole input, with no communication, and the
  element-wise ReLU works on a slice as well as on the whole;
- **row-parallel** ``net2``: rank ``r`` multiplies its hidden slice by its rows of ``B`` (its
  columns of ``net2.weight``, which ``nn.Linear`` stores transposed, ``out x in``); the ranks'
  partial outputs add up to the whole output: one all-reduce.

Two conjugate autograd functions place the communication (Shoeybi et al. 2019, "Megatron-LM:
Training Multi-Billion Parameter Language Models Using Model Parallelism", arXiv:1909.08053,
section 3 and figure 3): ``f`` is the identity in forward and an all-reduce in backward (every
rank's input gradient is a partial sum), ``g`` an all-reduce in forward and the identity in
backward. So one all-reduce in forward and one in backward per MLP.

    torchrun --nproc-per-node=4 -m ddp_tutorial.tensor_parallel.split_mlp   # hidden units split 4 ways
    torchrun --nproc-per-node=2 -m ddp_tutorial.tensor_parallel.split_mlp
    python -m ddp_tutorial.tensor_parallel.split_mlp                         # a world of one: nothing split
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from ddp_tutorial.env import distributed, rank_device
from ddp_tutorial.launch.errors import UsageParser, check_world_size, exit_on_interrupt
from ddp_tutorial.launch.verdict import verdict
from ddp_tutorial.models import ToyModel
from ddp_tutorial.pipeline_parallel.model_parallel import toy_batch

__all__ = ["TOLERANCE", "CopyToParallel", "ReduceFromParallel", "f", "g", "make_mlp", "shard_range", "expected_shard",
           "TensorParallelMLP", "hand_tp_worker", "one_process", "compare", "main"]

PROG = "python -m ddp_tutorial.tensor_parallel.split_mlp"

# float32 keeps about 7 significant digits (1.2e-7 between neighbours near 1). A split sums each
# output over the hidden units in other groups (per rank, then across ranks), so its last digit
# can differ from one process's; 1e-6 is ten such steps for values of order 1 (seen: 3e-8).
TOLERANCE = 1e-6


class CopyToParallel(torch.autograd.Function):
    """Megatron's ``f``: identity in forward, all-reduce of the gradient in backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        grad = grad.clone()  # each rank holds the input gradient of its hidden units only
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class ReduceFromParallel(torch.autograd.Function):
    """Megatron's ``g``: all-reduce in forward, identity in backward."""

    @staticmethod
    def forward(ctx, partial: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
        total = partial.clone()  # each rank's output is a partial sum over its hidden units
        dist.all_reduce(total, group=group)
        return total

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None  # the sum's gradient reaches every term unchanged


def f(x: torch.Tensor, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Enter the tensor-parallel region: identity now, all-reduce of the gradient in backward."""
    return CopyToParallel.apply(x, group)


def g(x: torch.Tensor, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Leave the tensor-parallel region: all-reduce now, identity in backward."""
    return ReduceFromParallel.apply(x, group)


def make_mlp(in_features: int = 10, hidden: int = 8, out_features: int = 5, seed: int = 0) -> ToyModel:
    """ToyModel (``net1 -> relu -> net2``) with a hidden width that splits evenly; same seed, same weights."""
    torch.manual_seed(seed)
    return ToyModel(in_features, hidden, out_features)


def shard_range(size: int, rank: int, world_size: int) -> slice:
    """Rank ``rank``'s even share of ``size`` units: ``slice(rank * size/n, (rank+1) * size/n)``."""
    if size % world_size:
        raise ValueError(f"{size} units do not split evenly over {world_size} ranks")
    part = size // world_size
    return slice(rank * part, (rank + 1) * part)


def expected_shard(name: str, full: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """The part of ToyModel's parameter (or gradient) ``name`` that rank ``rank`` holds when split.

    ``net1`` is column-parallel: its rows (output units) are split. ``net2`` is row-parallel:
    the columns of its weight (input units) are split, and its bias is kept whole on every rank.
    """
    if name.startswith("net1."):
        return full[shard_range(full.shape[0], rank, world_size)]
    if name == "net2.weight":
        return full[:, shard_range(full.shape[1], rank, world_size)]
    return full


class TensorParallelMLP(nn.Module):
    """ToyModel's two linears split over ``group``'s ranks: ``net1`` column-, ``net2`` row-parallel.

    Built from the whole model, so it starts from the very same weights on every rank.
    """

    def __init__(self, full: ToyModel, group: dist.ProcessGroup | None = None, use_f: bool = True):
        super().__init__()
        self.group, self.use_f = group, use_f
        rank, world_size = dist.get_rank(group), dist.get_world_size(group)
        hidden = full.net1.out_features
        mine = shard_range(hidden, rank, world_size)
        self.net1 = nn.Linear(full.net1.in_features, hidden // world_size)
        self.net2 = nn.Linear(hidden // world_size, full.net2.out_features)
        with torch.no_grad():
            self.net1.weight.copy_(full.net1.weight[mine])     # my rows: my hidden units
            self.net1.bias.copy_(full.net1.bias[mine])
            self.net2.weight.copy_(full.net2.weight[:, mine])  # my columns: the same hidden units
            self.net2.bias.copy_(full.net2.bias)               # whole, added once after the sum
        self.to(full.net1.weight.device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.use_f:
            x = f(x, self.group)  # nothing now; in backward, sums the ranks' input gradients
        h = torch.relu(self.net1(x))  # my slice of the hidden activations: no communication
        partial = nn.functional.linear(h, self.net2.weight)  # my hidden units' share of the output
        return g(partial, self.group) + self.net2.bias  # one all-reduce, then the bias once


def hand_tp_worker(rank: int, world_size: int, hidden: int = 8, batch_size: int = 4, seed: int = 0,
                   use_f: bool = True) -> dict:
    """One forward and backward of ToyModel split over all ranks; every rank gets the same input.

    Returns the output, the input's gradient, the rank's shard of every parameter gradient and
    the collectives counted in forward and in backward (``CommDebugMode`` sees c10d calls too).
    """
    from torch.distributed.tensor.debug import CommDebugMode

    device = rank_device()  # cuda:LOCAL_RANK with NCCL, else the CPU
    model = TensorParallelMLP(make_mlp(hidden=hidden, seed=seed).to(device), use_f=use_f)
    x, y = toy_batch(0, batch_size, seed, dtype=torch.float32)
    x, y = x.to(device).requires_grad_(), y.to(device)
    with CommDebugMode() as forward_comms:
        out = model(x)
        loss = nn.functional.mse_loss(out, y)
    with CommDebugMode() as backward_comms:
        loss.backward()
    return {"rank": rank, "output": out.detach().cpu(), "input_grad": x.grad.cpu(),
            "grads": {n: p.grad.cpu() for n, p in model.named_parameters()},
            "collectives": {"forward": forward_comms.get_total_counts(),
                            "backward": backward_comms.get_total_counts()}}


def one_process(hidden: int = 8, batch_size: int = 4, seed: int = 0) -> dict:
    """The unsplit ToyModel on the same input, in one process: what every split must reproduce."""
    model = make_mlp(hidden=hidden, seed=seed)
    x, y = toy_batch(0, batch_size, seed, dtype=torch.float32)
    x.requires_grad_()
    out = model(x)
    nn.functional.mse_loss(out, y).backward()
    return {"output": out.detach(), "input_grad": x.grad,
            "grads": {n: p.grad for n, p in model.named_parameters()}}


def compare(results: list[dict], reference: dict) -> dict:
    """The largest difference of each rank's output, input gradient and gradient shards to one process."""
    world_size = len(results)
    diff = {"output": 0.0, "input_grad": 0.0, "grads": 0.0}
    for rank, r in enumerate(results):
        diff["output"] = max(diff["output"], (r["output"] - reference["output"]).abs().max().item())
        diff["input_grad"] = max(diff["input_grad"], (r["input_grad"] - reference["input_grad"]).abs().max().item())
        for name, grad in r["grads"].items():
            want = expected_shard(name, reference["grads"][name], rank, world_size)
            assert grad.shape == want.shape, (rank, name, grad.shape, want.shape)
            diff["grads"] = max(diff["grads"], (grad - want).abs().max().item())
    return diff


def main(argv: list[str] | None = None) -> None:
    parser = UsageParser(prog=PROG, description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=8, help="hidden units, a multiple of the world size (default 8)")
    parser.add_argument("--batch-size", type=int, default=4, help="(default 4)")
    args = parser.parse_args(argv)
    for option, value in (("--hidden", args.hidden), ("--batch-size", args.batch_size)):
        if value < 1:
            parser.error(f"{option} must be at least 1, got {value}")
    # Every rank would refuse an uneven split alike: said once, from torchrun's WORLD_SIZE, before any group.
    check_world_size(PROG, lambda world_size: shard_range(args.hidden, 0, world_size),
                     advice="choose --hidden a multiple of torchrun's --nproc-per-node")
    with exit_on_interrupt(PROG, "nothing was saved; run it again"), distributed() as (info, _):
        result = hand_tp_worker(info.rank, info.world_size, args.hidden, args.batch_size)
        results = [None] * info.world_size
        dist.all_gather_object(results, result)
    if info.is_main:
        diff = compare(results, one_process(args.hidden, args.batch_size))
        ok = max(diff.values()) < TOLERANCE
        print(f"all-reduces per rank: forward {result['collectives']['forward']}, "
              f"backward {result['collectives']['backward']}")
        verdict(ok, f"ToyModel split over {info.world_size} rank(s) (net1 column-, net2 "
                    f"row-parallel) equals one process, outputs and gradients to {TOLERANCE:g}")


if __name__ == "__main__":
    main()
