"""Typical wrong answers to the exercises, and the words their diagnosis must contain.

``tests/exercises/test_exercises.py`` writes each to a file and checks it with ``--file``. Each entry:
``(exercise, source, words the one-paragraph diagnosis must hold, timeout in seconds)``.
"""

from __future__ import annotations

from ddp_tutorial.exercises.workspace import solution_file


def broken(name: str, old: str, new: str) -> str:
    """The reference solution of ``name`` with one mistake put in."""
    source = solution_file(name).read_text()
    assert old in source, old
    return source.replace(old, new)


HEAD = "import torch\nimport torch.distributed as dist\n\n\n"

RING_START = HEAD + """def ring_all_reduce(tensor):
    rank, n = dist.get_rank(), dist.get_world_size()
    if n == 1:
        return tensor
    chunks = tensor.view(-1).tensor_split(n)
    right, left = (rank + 1) % n, (rank - 1) % n
    buf = torch.empty_like(chunks[0])

    def step(send, into):
        works = [dist.isend(chunks[send], dst=right), dist.irecv(into, src=left)]
        for w in works:
            w.wait()

"""
REDUCE_SCATTER = """    for t in range(n - 1):
        target = chunks[(rank - t - 1) % n]
        step((rank - t) % n, buf[:target.numel()])
        target.add_(buf[:target.numel()])
"""
ALL_GATHER = """    for t in range(n - 1):
        step((rank + 1 - t) % n, chunks[(rank - t) % n])
"""

RING_SHIFT_START = HEAD + """def ring_shift(tensor, hops=1):
    rank, n = dist.get_rank(), dist.get_world_size()
    held, arriving = tensor.clone(), torch.empty_like(tensor)
    for _ in range(hops if n > 1 else 0):
"""

HOOKS = solution_file("bucketed_grad_hooks").read_text()


def hooks(old: str, new: str) -> str:
    """The reference bucketed_grad_hooks with one mistake put in."""
    assert old in HOOKS, old
    return HOOKS.replace(old, new)


MISTAKES = {
    "ring skips the all-gather": (
        "ring_all_reduce", RING_START + REDUCE_SCATTER + "    return tensor\n",
        ["rank 0", "chunk 0", "rank 1 missing", "The all-gather phase made it wrong", "missing or stops early"], 20),
    "ring sends the wrong chunk (off by one)": (
        "ring_all_reduce", RING_START + REDUCE_SCATTER.replace("step((rank - t) % n", "step((rank - t + 1) % n")
        + ALL_GATHER + "    return tensor\n",
        ["rank 0", "chunk 0", "The reduce-scatter phase made it wrong", "off by one"], 20),
    "ring overwrites instead of adding in the reduce-scatter": (
        "ring_all_reduce", RING_START + REDUCE_SCATTER.replace("target.add_(", "target.copy_(")
        + ALL_GATHER + "    return tensor\n",
        ["rank 0", "The reduce-scatter phase made it wrong", "add_, not copy_"], 20),
    "ring adds instead of copying in the all-gather": (
        "ring_all_reduce", RING_START + REDUCE_SCATTER + """    for t in range(n - 1):
        target = chunks[(rank - t) % n]
        step((rank + 1 - t) % n, buf[:target.numel()])
        target.add_(buf[:target.numel()])
    return tensor
""", ["rank 0", "The all-gather phase made it wrong", "copies the finished chunk"], 20),
    "ring receives into the wrong chunk in the all-gather": (
        "ring_all_reduce", RING_START + REDUCE_SCATTER + ALL_GATHER.replace("chunks[(rank - t) % n]",
                                                                            "chunks[(rank - t - 1) % n]")
        + "    return tensor\n",
        ["world of 2", "The all-gather phase made it wrong", "landed at another chunk's place"], 20),
    "ring deadlocks: every rank sends first": (
        "ring_all_reduce", RING_START + REDUCE_SCATTER.replace(
            "step((rank - t) % n, buf[:target.numel()])",
            "dist.send(chunks[(rank - t) % n], dst=right)\n        dist.recv(buf[:target.numel()], src=left)")
        + ALL_GATHER + "    return tensor\n",
        ["ranks 0, 1 are still running after 8 s", "stuck in send to rank", "deadlock"], 8),
    "ring sends whole tensors": (
        "ring_all_reduce", HEAD + """def ring_all_reduce(tensor):
    rank, n = dist.get_rank(), dist.get_world_size()
    passing, arriving, total = tensor.clone(), torch.empty_like(tensor), tensor.clone()
    for _ in range(n - 1):
        works = [dist.isend(passing, dst=(rank + 1) % n), dist.irecv(arriving, src=(rank - 1) % n)]
        for w in works:
            w.wait()
        total += arriving
        passing, arriving = arriving, passing
    tensor.copy_(total)
    return tensor
""", ["world of 3", "the result is right, but it sent", "send chunks, not the whole tensor"], 20),
    "ring calls dist.all_reduce": (
        "ring_all_reduce", HEAD + "def ring_all_reduce(tensor):\n    dist.all_reduce(tensor)\n    return tensor\n",
        ["rank 0", "NotAllowed", "dist.all_reduce", "at line 6"], 20),
    "ring calls the course's own ring_all_reduce": (
        "ring_all_reduce", HEAD + "from ddp_tutorial.comm.ring import ring_all_reduce as course_ring\n\n\n"
        "def ring_all_reduce(tensor):\n    return course_ring(tensor)\n",
        ["rank 0", "NotAllowed", "imports ddp_tutorial.comm.ring:", "write this yourself"], 20),
    "ring copies the solution": (
        "ring_all_reduce", HEAD + "from ddp_tutorial.exercises.solutions.ring_all_reduce import ring_all_reduce\n",
        ["NotAllowed", "imports ddp_tutorial.exercises.solutions"], 20),
    "ring reaches the solution by a computed name": (
        "ring_all_reduce", HEAD + "import importlib\n\n\ndef ring_all_reduce(tensor):\n"
        "    where = 'ddp_tutorial.exercises.' + 'solu' + 'tions.ring_all_reduce'\n"
        "    return importlib.import_module(where).ring_all_reduce(tensor)\n",
        ["NotAllowed", "your code reached ddp_tutorial.exercises.solutions.ring_all_reduce", "write this yourself",
         "at line 10"], 20),
    "ring reads the course's ring by path": (
        "ring_all_reduce", HEAD + "import runpy\n\nimport ddp_tutorial.comm\n\n\ndef ring_all_reduce(tensor):\n"
        "    ring = runpy.run_path(ddp_tutorial.comm.__path__[0] + '/ring.py')\n"
        "    return ring['ring_all_reduce'](tensor)\n",
        ["NotAllowed", "your code reached the file", "ring.py", "write this yourself"], 20),
    "ring receives a chunk smaller than the message": (
        "ring_all_reduce", RING_START.replace("dist.isend(chunks[send]", "dist.isend(tensor.view(-1)")  # all of it
        + REDUCE_SCATTER + ALL_GATHER + "    return tensor\n",
        ["died", "receive buffer", "size"], 20),
    "hooks sum instead of average": (
        "bucketed_grad_hooks", hooks("torch.div(param.grad, world_size, out=slices[index])",
                                     "slices[index].copy_(param.grad)"),
        ["rank 0 of a world of 2", "parameter net1.weight", "sum over the 2 ranks, not their mean"], 20),
    "hooks all-reduce after backward": (
        "bucketed_grad_hooks", hooks("works.append(dist.all_reduce(flats[len(works)], async_op=True))",
                                     "break").replace("for work in works:\n            work.wait()",
                                                      "for flat in flats:\n            dist.all_reduce(flat)"),
        ["bucket 0's all-reduce started after backward had returned", "from the hook"], 20),
    "hooks forget to reset for the next backward": (
        "bucketed_grad_hooks", hooks("missing[:] = [len(indices) for indices in buckets]", "pass"),
        ["step 2", "reset"], 20),
    "hooks give every parameter the same slice": (
        "bucketed_grad_hooks", hooks("offset += params[i].numel()", "pass"),
        ["rank 0 of a world of 1", "case toy model, one bucket", "parameter net1.bias", "differs from the mean"], 20),
    "hooks registered with register_hook": (
        "bucketed_grad_hooks", hooks("torch.div(param.grad, world_size, out=slices[index])",
                                     "torch.div(param, world_size, out=slices[index])")
        .replace("p.register_post_accumulate_grad_hook(lambda param, i=i: hook(i, param))",
                 "p.register_hook(lambda grad, i=i: hook(i, grad))"),
        ["rank 0 of a world of 1", "net1.weight's hook was registered with register_hook",
         "register_post_accumulate_grad_hook"], 20),
    "ring_shift deadlocks: blocking send first": (
        "ring_shift", RING_SHIFT_START + """        dist.send(held, dst=(rank + 1) % n)
        dist.recv(held, src=(rank - 1) % n)
    return held
""", ["still running after 8 s", "stuck in send to rank 1", "deadlock"], 8),
    "ring_shift passes to the left": (
        "ring_shift", RING_SHIFT_START + """        left, right = (rank - 1) % n, (rank + 1) % n
        works = [dist.isend(held, dst=left), dist.irecv(arriving, src=right)]
        for w in works:
            w.wait()
        held, arriving = arriving, held
    return held
""", ["rank 0 of a world of 3", "rank 1's token", "should hold rank 2's token"], 20),
    "all_gather fills the wrong entries": (
        "all_gather_p2p", HEAD + """def all_gather_p2p(tensor):
    rank, n = dist.get_rank(), dist.get_world_size()
    out = [tensor.clone() for _ in range(n)]
    works = []
    for peer in range(n):
        if peer != rank:
            works += [dist.isend(tensor, dst=peer), dist.irecv(out[(peer + 1) % n], src=peer)]
    for w in works:
        w.wait()
    return out
""", ["rank 0 of a world of 2", "entry 0 holds rank 1's tensor"], 20),
    "init_from_file uses env://": (
        "init_from_file", HEAD + """def init_from_file(rank, world_size, path):
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
""", ["rank 0", "not made through the file", "file://"], 20),
}

# Other right answers the checker must accept: name -> (exercise, source, timeout in seconds)
ALSO_RIGHT = {
    "ring skips empty chunks on both sides (fewer elements than ranks)": (
        "ring_all_reduce", RING_START.replace(
            "        works = [dist.isend(chunks[send], dst=right), dist.irecv(into, src=left)]",
            "        # the receiver's chunk is the sender's, and every rank computes the same sizes: both skip it\n"
            "        works = ([dist.isend(chunks[send], dst=right)] if chunks[send].numel() else [])\n"
            "        works += [dist.irecv(into, src=left)] if into.numel() else []")
        + REDUCE_SCATTER + ALL_GATHER + "    return tensor\n", 20),
}
