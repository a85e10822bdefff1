"""A simulated wire of known bandwidth beside gloo, to show what overlap hides (``08_ddp_from_scratch``).

On a few CPU cores gloo's all-reduce is work for the same cores that run backward, so
starting it early hides little. On a GPU cluster the bytes are moved by other hardware
(NVLink, a network card) while the cores compute. ``SimulatedLink`` stands in for that
hardware: every all-reduce it carries really runs (the gradients are right), and it also
occupies a wire for ``wire_seconds(nbytes)``, a sleep on one wire thread. A sleeping thread
takes no core, so the wire time passes *beside* backward, as a real link's would, and the
messages queue on the wire one after another in the order they were sent.

A ring all-reduce sends ``2 (N - 1) / N`` times the message through each rank's link, so a
message of ``nbytes`` occupies the wire for ``latency + 2 (N - 1) / N * nbytes / bandwidth``
(``bandwidth`` in bytes per second, the link's speed; its inverse is the seconds per byte).
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor

import torch
import torch.distributed as dist

__all__ = ["SimulatedLink", "LinkWork"]


class LinkWork:
    """The handle of one all-reduce on the link: done when the real all-reduce and its wire time both are."""

    def __init__(self, job: Future, work: dist.Work, result: torch.Tensor):
        self.job = job
        self.work = work
        self.result = result

    def wait(self) -> bool:
        self.job.result()  # the wire time is over (and its error re-raised, if it had one)
        # In the caller's thread: with NCCL this orders the caller's CUDA stream after the all-reduce.
        self.work.wait()
        return True

    def get_future(self) -> torch.futures.Future:
        fut: torch.futures.Future = torch.futures.Future()
        self.job.add_done_callback(lambda _: fut.set_result(self.result))
        return fut


class SimulatedLink:
    """An all-reduce that also holds a wire of ``bandwidth`` bytes/s for its transfer time (see the module)."""

    def __init__(self, bandwidth: float, latency: float = 0.0):
        self.bandwidth = bandwidth
        self.latency = latency
        self.wire = ThreadPoolExecutor(max_workers=1, thread_name_prefix="wire")  # one message at a time
        self.events: list[tuple[str, int, float]] = []  # ("send" | "on wire" | "off wire", bytes, time)

    def wire_seconds(self, nbytes: int, world_size: int) -> float:
        """How long a ring all-reduce of ``nbytes`` keeps this rank's link busy."""
        if world_size == 1:
            return 0.0
        return self.latency + 2 * (world_size - 1) / world_size * nbytes / self.bandwidth

    def all_reduce(self, tensor: torch.Tensor, group: dist.ProcessGroup | None = None,
                   async_op: bool = False) -> LinkWork | None:
        """``dist.all_reduce(tensor, group=group)``, plus the wire time; a handle when ``async_op``."""
        nbytes = tensor.numel() * tensor.element_size()
        seconds = self.wire_seconds(nbytes, dist.get_world_size(group))
        self.events.append(("send", nbytes, time.perf_counter()))
        work = dist.all_reduce(tensor, group=group, async_op=True)  # issued here, in order, on every rank
        job = self.wire.submit(self._carry, work if tensor.device.type == "cpu" else None, nbytes, seconds)
        handle = LinkWork(job, work, tensor)
        if async_op:
            return handle
        handle.wait()
        return None

    def _carry(self, work: dist.Work | None, nbytes: int, seconds: float) -> None:
        self.events.append(("on wire", nbytes, time.perf_counter()))
        time.sleep(seconds)
        if work is not None:  # gloo: off the wire once the bytes arrived (a CUDA work is waited by the caller)
            work.wait()
        self.events.append(("off wire", nbytes, time.perf_counter()))

    def close(self) -> None:
        self.wire.shutdown(wait=True)
