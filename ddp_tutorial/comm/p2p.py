"""Point-to-point messages: send/recv, isend/irecv, batch_isend_irecv, a token ring, deadlocks.

Used by ``04_point_to_point``. The workers run under ``launch.spawn`` (the group
is already set up), except ``swap``, which sets up its own group with a short
timeout so that a deadlock turns into an error. From a shell:

    torchrun --nproc-per-node=2 -m ddp_tutorial.comm.p2p
    torchrun --nproc-per-node=4 -m ddp_tutorial.comm.p2p
    python -m ddp_tutorial.comm.p2p     # fails: a message needs a second rank
"""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist

from ddp_tutorial.env import distributed, rank_device
from ddp_tutorial.launch.errors import check_world_size, exit_on_interrupt

PROG = "python -m ddp_tutorial.comm.p2p"

SWAP_ORDERS = ("send-first", "recv-first", "by-parity", "nonblocking", "batched")


def send_recv(rank: int, world_size: int) -> dict:
    """Blocking: rank 0 sends its tensor to every other rank in turn; they ``recv`` into a buffer."""
    device = rank_device()  # NCCL moves only GPU tensors: cuda:LOCAL_RANK there, the CPU with gloo
    if rank == 0:
        data = torch.tensor([1.0, 2.0, 3.0], device=device)
        before = data.tolist()
        for dst in range(1, world_size):
            dist.send(data, dst=dst)  # returns once the message is handed over
    else:
        data = torch.zeros(3, device=device)  # recv needs a buffer of the right shape and dtype
        before = data.tolist()
        dist.recv(data, src=0)
    return {"rank": rank, "before": before, "after": data.tolist()}


def nonblocking(rank: int, world_size: int) -> dict:
    """``isend``/``irecv`` return a work handle at once; the transfer is done after ``wait()``."""
    device = rank_device()
    if rank == 0:
        data = torch.tensor([4.0, 5.0, 6.0], device=device)
        works = [dist.isend(data, dst=dst) for dst in range(1, world_size)]
    else:
        data = torch.zeros(3, device=device)
        works = [dist.irecv(data, src=0)]
    # Here the rank is free to compute while the message travels, but not to touch
    # `data`: until wait() returns it may be half sent or half received.
    for work in works:
        work.wait()
    return {"rank": rank, "handles": len(works), "completed": all(w.is_completed() for w in works),
            "after": data.tolist()}


def ring_exchange(rank: int, world_size: int) -> dict:
    """Everyone sends to the right neighbour and receives from the left in one ``batch_isend_irecv``."""
    if world_size < 2:
        raise ValueError("a ring exchange needs at least 2 ranks")
    right, left = (rank + 1) % world_size, (rank - 1) % world_size
    device = rank_device()
    outgoing = torch.tensor([10.0 * rank], device=device)
    incoming = torch.zeros(1, device=device)
    ops = [dist.P2POp(dist.isend, outgoing, right), dist.P2POp(dist.irecv, incoming, left)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    return {"rank": rank, "sent to": right, "received from": left, "received": incoming.item()}


def pass_token(rank: int, world_size: int, laps: int = 1) -> dict:
    """A token goes round the ring 0 -> 1 -> ... -> n-1 -> 0, ``laps`` times; each holder adds 1.

    Returns the rank's ``sends`` as ``(hop, dst, value)``; rank 0 also returns
    the ``final`` value, which is ``laps * world_size``.
    """
    if world_size < 2:
        raise ValueError("passing a token needs at least 2 ranks")
    right, left = (rank + 1) % world_size, (rank - 1) % world_size
    token = torch.zeros(1, device=rank_device())
    sends = []
    for lap in range(laps):
        if rank != 0 or lap > 0:  # only rank 0, at the start, holds the token without waiting
            dist.recv(token, src=left)
        token += 1
        sends.append((int(token.item()), right, token.item()))  # hop number = token value
        dist.send(token, dst=right)
    if rank == 0:
        dist.recv(token, src=left)  # the token comes home
    return {"rank": rank, "sends": sends, "final": token.item() if rank == 0 else None}


def swap(rank: int, world_size: int, order: str, timeout: float = 2.0) -> dict:
    """Ranks 2k and 2k+1 swap a tensor; ``order`` says how. Run with ``spawn(init_process_group=False)``.

    The swap runs in a group with a ``timeout``-second limit, so that a deadlock
    becomes an error on each rank, reported as ``"stuck in <call>"``. It uses gloo,
    which raises; NCCL's watchdog would abort the process instead.
    """
    if order not in SWAP_ORDERS:
        raise ValueError(f"unknown order {order!r}; choose one of {SWAP_ORDERS}")
    if world_size % 2:
        raise ValueError(f"ranks swap in pairs: world_size must be even, got {world_size}")
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    # Meeting may take a while on a busy machine; only the swap gets the short limit.
    pair = dist.new_group(timeout=timedelta(seconds=timeout))
    peer = rank ^ 1  # 0<->1, 2<->3, ...
    mine, theirs = torch.tensor([float(rank)]), torch.full((1,), -1.0)
    if order in ("nonblocking", "batched"):
        steps = ["post both, then wait"]
    elif order == "send-first" or (order == "by-parity" and rank % 2 == 0):
        steps = ["send", "recv"]
    else:
        steps = ["recv", "send"]
    try:
        for step in steps:
            if step == "send":
                dist.send(mine, peer, group=pair)
            elif step == "recv":
                dist.recv(theirs, peer, group=pair)
            else:
                for work in _post_both(order, mine, theirs, peer, pair):
                    work.wait()
        outcome = f"got {theirs.item():.0f}"
    except RuntimeError as err:
        # The first rank to time out drops its connections, so its peer may see
        # "Connection closed" a moment before its own timer would have fired.
        if "Timed out" not in str(err) and "Connection closed" not in str(err):
            raise
        outcome = f"stuck in {step}"
    finally:
        dist.destroy_process_group()
    return {"rank": rank, "order": order, "outcome": outcome}


def _post_both(order: str, mine: torch.Tensor, theirs: torch.Tensor, peer: int, group) -> list:
    if order == "nonblocking":
        return [dist.isend(mine, peer, group=group), dist.irecv(theirs, peer, group=group)]
    return dist.batch_isend_irecv([dist.P2POp(dist.isend, mine, peer, group=group),
                                   dist.P2POp(dist.irecv, theirs, peer, group=group)])


def main() -> None:
    def fits(world_size: int) -> None:
        if world_size < 2:
            raise ValueError(f"needs at least 2 ranks (a message needs a receiver), got {world_size}")

    # Said once, from torchrun's WORLD_SIZE (or its absence), before any group.
    check_world_size(PROG, fits, advice="start it with torchrun --nproc-per-node=2 -m ddp_tutorial.comm.p2p")
    with exit_on_interrupt(PROG, "nothing was saved; run it again"), distributed() as (info, _device):
        result = pass_token(info.rank, info.world_size, laps=2)
        ring = ring_exchange(info.rank, info.world_size)
        print(f"rank {info.rank}: passed the token at hops {[hop for hop, _, _ in result['sends']]}; "
              f"received {ring['received']:.0f} from rank {ring['received from']}")
        if info.is_main:
            assert result["final"] == 2 * info.world_size, result
            print(f"token came home with value {result['final']:.0f}: OK")


if __name__ == "__main__":
    main()
