"""ZeRO-3 from scratch: the parameters sharded too, gathered one module at a time (``18_zero3_and_checkpoints``).

ZeRO-1 and ZeRO-2 (``zero``) shard the optimizer state and the gradients; every rank still
holds every weight. ``Zero3`` shards the weights themselves, in the layout of FSDP1's
``FlatParameter`` and DeepSpeed's ZeRO-3 (flat and padded; FSDP2 instead keeps each parameter
as a ``DTensor`` cut along dim 0, ``Shard(0)``, which is what lets its checkpoints reshard):

- every parameter of two or more dimensions becomes this rank's flat shard (padded so all
  shards are equal): ``param.data`` has ``ceil(numel / N)`` elements, float32;
- each module that owns parameters is a *unit*; a forward pre-hook all-gathers its weights
  (cast to ``compute_dtype`` first: half the bytes on the wire) into full tensors that the
  module's own ``forward`` reads as ``self.weight``; a forward hook frees them again
  (their storage resized to 0: autograd's saved copy points at the same storage);
- a hook on the unit's output fires when its backward starts: gather again (same storage);
- when every full weight's gradient has accumulated, one asynchronous reduce-scatter (float32,
  summed, divided by N) sends each rank its slice, and the full weights and gradients are freed;
- 1-D parameters (norm scales, biases) stay replicated: cast for compute, their gradients
  averaged with one all-reduce per step, all units' in one bucket (as DDP's buckets: one
  all-reduce of a few hundred bytes per unit costs its latency every time, a third of the
  step on 4 CPU ranks);
- prefetch: the next unit's all-gather (``async_op=True``) is issued before the current unit
  computes, in the order the first forward recorded (reversed for backward).

After ``backward()``, ``finish_gradient_synchronization()`` waits for the reduce-scatters and
sets every ``param.grad`` (float32, the shape of ``param.data``); any optimizer over
``.parameters()`` then updates the shards. Limits: a unit runs once per forward (no weight
tying, no reuse), and its forward returns one tensor.

    torchrun --nproc-per-node=2 -m ddp_tutorial.sharding.zero3_train
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from ddp_tutorial.comm.collectives import all_gather_single, reduce_scatter_single

__all__ = ["Zero3", "shard_of", "unshard"]

# The all-gather moves bytes: a uint8 view sends any dtype exactly, bfloat16 included where a gloo
# release lacks it ("Invalid scalar type" for int16), and costs nothing on NCCL.
WIRE = torch.uint8


def shard_of(full: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """Rank ``rank``'s flat shard of ``full``: ``ceil(numel / N)`` elements, zero-padded at the end."""
    s = -(-full.numel() // world_size)
    padded = torch.zeros(s * world_size, dtype=full.dtype, device=full.device)
    padded[:full.numel()] = full.detach().reshape(-1)
    return padded[rank * s:(rank + 1) * s].clone()


def unshard(gathered: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """The full tensor from the concatenated shards: drop the padding, restore the shape."""
    return gathered[:shape.numel()].view(shape)


class Zero3(nn.Module):
    """ZeRO-3 (FSDP) around any module whose forward reads its own parameters; see the module docstring.

    ``module``'s weights must be equal on every rank (same seed), as ``fully_shard`` assumes.
    ``compute_dtype``: ``None`` (float32), ``torch.float16`` or ``torch.bfloat16``.
    """

    def __init__(self, module: nn.Module, compute_dtype: torch.dtype | None = None,
                 group: dist.ProcessGroup | None = None):
        super().__init__()
        self.module, self.group, self.dtype = module, group, compute_dtype
        self.rank, self.world_size = dist.get_rank(group), dist.get_world_size(group)
        self.units = [m for m in module.modules() if list(m.parameters(recurse=False))]
        self.params = {unit: list(unit.named_parameters(recurse=False)) for unit in self.units}  # the masters
        self.shapes: dict[nn.Parameter, torch.Size] = {}  # master parameter -> its full shape
        for unit in self.units:
            for _, p in self.params[unit]:
                self.shapes[p] = p.shape
                p.data = shard_of(p.data.float(), self.rank, self.world_size) if p.dim() >= 2 else p.data.float()
            unit.register_forward_pre_hook(self.before_forward)
            unit.register_forward_hook(self.after_forward)
        self.order: list[nn.Module] = []  # the units as the first forward ran them
        self.recording, self.backward_phase = True, False
        self.full: dict[nn.Module, dict[str, nn.Parameter]] = {}  # unit -> name -> its full weight now
        self.waiting: dict[nn.Module, int] = {}  # unit -> full weights whose gradient has not arrived
        self.prefetched: dict[nn.Module, tuple] = {}
        self.pending: list[tuple] = []  # (handle, reduced buffer, master parameters in it) per reduction
        self.bucket: list[tuple] = []  # (gradients, master parameters) of the replicated ones, for one all-reduce
        self.gathered_bytes = self.peak_gathered_bytes = 0
        self.gathers = 0  # all-gathers issued (the tests count them)
        self.names = {unit: name or "(root)" for name, unit in module.named_modules() if unit in self.params}
        self.timeline: list[tuple[str, str, str]] = []  # (phase, event, unit) of the last step, in order

    def forward(self, *args, **kwargs):
        self.backward_phase, self.timeline = False, []
        out = self.module(*args, **kwargs)
        self.recording, self.backward_phase = False, True
        return out

    def sharded(self, unit: nn.Module) -> list[tuple[str, nn.Parameter]]:
        return [(n, p) for n, p in self.params[unit] if len(self.shapes[p]) >= 2]

    def count(self, tensor: torch.Tensor, sign: int) -> None:
        self.gathered_bytes += sign * tensor.numel() * tensor.element_size()
        self.peak_gathered_bytes = max(self.peak_gathered_bytes, self.gathered_bytes)

    # --- all-gather: one collective per unit, all its sharded weights at once -----------------
    def issue_gather(self, unit: nn.Module) -> tuple:
        shards = [p.detach().to(self.dtype or p.dtype) for _, p in self.sharded(unit)]  # cast, then send
        if not shards:
            return None, None
        local = torch.cat(shards)
        out = torch.empty(local.numel() * self.world_size, dtype=local.dtype, device=local.device)
        self.gathers += 1
        self.log("all-gather issued", unit)
        return all_gather_single(out.view(WIRE), local.view(WIRE), group=self.group, async_op=True), out

    def next_unit(self, unit: nn.Module) -> nn.Module | None:
        order = self.order[::-1] if self.backward_phase else self.order
        i = order.index(unit) if unit in order else len(order)
        return order[i + 1] if i + 1 < len(order) else None

    def gather(self, unit: nn.Module) -> None:
        """Fill ``unit``'s full weights (prefetched or gathered now); first, prefetch the next unit's."""
        handle, out = self.prefetched.pop(unit, None) or self.issue_gather(unit)
        following = None if self.recording else self.next_unit(unit)
        if following is not None and following not in self.prefetched:
            self.prefetched[following] = self.issue_gather(following)  # in flight while `unit` computes
        if handle is not None:
            handle.wait()
        self.log("computes", unit)
        full, offset = self.full.setdefault(unit, {}), 0
        for name, p in self.params[unit]:
            shape = self.shapes[p]
            if name not in full:  # a new leaf for this pass: autograd accumulates its gradient
                full[name] = nn.Parameter(torch.empty(shape, dtype=self.dtype or p.dtype, device=p.device))
                full[name].register_post_accumulate_grad_hook(lambda _, unit=unit: self.grad_ready(unit))
                self.waiting[unit] = self.waiting.get(unit, 0) + 1
                if len(shape) >= 2:  # replicated copies are not gathered: not counted
                    self.count(full[name], +1)
            elif full[name].untyped_storage().size() == 0:  # freed after forward: bring the bytes back
                full[name].untyped_storage().resize_(full[name].numel() * full[name].element_size())
                self.count(full[name], +1)
            # .data: autograd's saved reference must not see a new version (the bytes are the same ones)
            if len(shape) >= 2:
                columns = out.view(self.world_size, -1)[:, offset:offset + p.numel()]
                full[name].data.copy_(unshard(columns.reshape(-1), shape))
                offset += p.numel()
            else:
                full[name].data.copy_(p.detach())  # replicated: only the cast

    def log(self, event: str, unit: nn.Module) -> None:
        self.timeline.append(("backward" if self.backward_phase else "forward", event, self.names[unit]))

    def free(self, unit: nn.Module, full: dict[str, nn.Parameter]) -> None:
        """Give back the full weights' bytes; autograd's saved references keep the (empty) storage."""
        for name, _ in self.sharded(unit):
            tensor = full[name]
            if tensor.untyped_storage().size() > 0:
                self.count(tensor, -1)
                tensor.untyped_storage().resize_(0)

    # --- the hooks ------------------------------------------------------------------------------
    def before_forward(self, unit: nn.Module, args: tuple) -> None:
        if self.recording:
            self.order.append(unit)
        self.gather(unit)
        for name, tensor in self.full[unit].items():
            setattr(unit, name, tensor)  # the module's forward reads the full weight as self.<name>

    def after_forward(self, unit: nn.Module, args: tuple, output: torch.Tensor) -> None:
        for name, master in self.params[unit]:
            setattr(unit, name, master)  # .module's parameters are the shards again
        self.free(unit, self.full[unit])
        if torch.is_grad_enabled() and isinstance(output, torch.Tensor) and output.requires_grad:
            output.register_hook(lambda grad, unit=unit: self.gather(unit))  # this unit's backward starts
        else:  # no backward will come: forget this pass's full weights
            self.full.pop(unit)
            self.waiting.pop(unit)

    # --- gradients: one reduce-scatter per unit (sharded), one all-reduce per step (replicated) -
    def grad_ready(self, unit: nn.Module) -> None:
        self.waiting[unit] -= 1
        if self.waiting[unit] == 0:
            self.reduce(unit)

    def reduce(self, unit: nn.Module) -> None:
        """Start ``unit``'s gradient reductions (float32, summed), then free its full weights and gradients."""
        full, n = self.full.pop(unit), self.world_size
        self.waiting.pop(unit)
        sharded = self.sharded(unit)
        replicated = [(name, p) for name, p in self.params[unit] if len(self.shapes[p]) < 2]

        def grad(name: str, p: nn.Parameter) -> torch.Tensor:
            g = full[name].grad
            return torch.zeros(self.shapes[p], device=p.device) if g is None else g.float()

        if sharded:  # rows[r] = every weight's slice r, side by side: the reduce-scatter's input order
            rows = torch.cat([nn.functional.pad(grad(name, p).reshape(-1), (0, p.numel() * n - self.shapes[p].numel()))
                              .view(n, -1) for name, p in sharded], dim=1)
            out = rows.new_empty(rows.shape[1])
            handle = reduce_scatter_single(out, rows.reshape(-1), group=self.group, async_op=True)
            self.log("reduce-scatter issued", unit)
            self.pending.append((handle, out, [p for _, p in sharded]))
        if replicated:
            self.bucket.append((torch.cat([grad(name, p).reshape(-1) for name, p in replicated]),
                                [p for _, p in replicated]))
        self.free(unit, full)
        for tensor in full.values():
            tensor.grad = None

    def finish_gradient_synchronization(self) -> None:
        """Wait for the reductions; every master parameter's ``.grad`` += its averaged slice (float32)."""
        for unit in [u for u in self.order[::-1] if u in self.full]:  # unused weights: zeros, on every rank
            self.reduce(unit)
        for handle, _ in self.prefetched.values():
            if handle is not None:
                handle.wait()
        self.prefetched.clear()
        if self.bucket:  # every unit's replicated gradients, in the order backward reduced them
            flat = torch.cat([g for g, _ in self.bucket])
            self.pending.append((dist.all_reduce(flat, group=self.group, async_op=True), flat,
                                 [p for _, params in self.bucket for p in params]))
            self.bucket.clear()
        for handle, flat, params in self.pending:
            handle.wait()
            offset = 0
            for p in params:
                g = flat[offset:offset + p.numel()].view_as(p) / self.world_size
                p.grad = g if p.grad is None else p.grad + g
                offset += p.numel()
        self.pending.clear()

    @torch.no_grad()
    def gather_full_params(self) -> dict[str, torch.Tensor]:
        """Every parameter's full float32 value, by its name in ``.module`` (an all-gather per sharded one)."""
        result = {}
        for prefix, unit in self.module.named_modules():
            for name, p in self.params.get(unit, []):
                full = p.detach()
                if len(self.shapes[p]) >= 2:
                    out = p.new_empty(p.numel() * self.world_size)
                    all_gather_single(out, p.detach(), group=self.group)
                    full = unshard(out, self.shapes[p])
                result[f"{prefix}.{name}" if prefix else name] = full.clone()
        return result
