"""Typical wrong answers to exercises 7.1, 9.1, 10.1 and 11.1, and the words their diagnosis must contain.

Among them the wrong answers whose numbers are right, caught by what the checker records: a
forward that moves nothing, a checkpoint read without waiting, a scoring loop in training mode.

Each entry, as in ``exercise_mistakes.py``: ``(exercise, source, words, timeout in seconds)``.
"""

from __future__ import annotations

from exercise_mistakes import HEAD, broken

MISTAKES = {
    "shard without padding": (
        "shard", broken("shard", "    while len(indices) < total:\n", "    while False:\n"),
        ["rank 1", "no padding", "same number of indices"], 20),
    "shard seeded without the epoch": (
        "shard", broken("shard", "g.manual_seed(seed + epoch)", "g.manual_seed(seed)"),
        ["epoch=1", "indices of epoch 0", "seed + epoch"], 20),
    "shard seeded with the rank": (
        "shard", broken("shard", "g.manual_seed(seed + epoch)", "g.manual_seed(seed + epoch + rank)"),
        ["rank 1", "is the rank in the seed", "shuffle identically"], 20),
    "shard not shuffled": (
        "shard", broken("shard", "torch.randperm(num_samples, generator=g).tolist()", "list(range(num_samples))"),
        ["rank 0", "Not shuffled"], 20),
    "split_forward: return model(x)": (
        "split_forward", HEAD + "def split_forward(model, x, devices):\n    return model(x)\n",
        ["rank 0 of a world of 1", "the numbers are right", "model.net1 was never moved", "'cpu:0'"], 20),
    "split_forward moves the layers, not the tensors": (
        "split_forward", broken("split_forward", "    hidden = model.relu(model.net1(x.to(dev0)))\n"
                                "    return model.net2(hidden.to(dev1))", "    return model(x)"),
        ["rank 0", "x went into net1 without a move to devices[0]"], 20),
    "split_forward sends the hidden activation to the first device": (
        "split_forward", broken("split_forward", "hidden.to(dev1)", "hidden.to(dev0)"),
        ["rank 0", "the hidden activation relu(net1(x)) went into net2 without a move to devices[1]",
         "'cpu:1'"], 20),
    "split_forward detaches the hidden activation": (
        "split_forward", broken("split_forward", "hidden.to(dev1)", "hidden.detach().to(dev1)"),
        ["rank 0", "net1.weight got no gradient", "graph is cut"], 20),
    "split_forward forgets the relu": (
        "split_forward", broken("split_forward", "model.relu(model.net1(x.to(dev0)))", "model.net1(x.to(dev0))"),
        ["rank 0", "relu", "missing"], 20),
    "split_forward under no_grad": (
        "split_forward", broken("split_forward", "    hidden = model.relu", "    with torch.no_grad():\n"
                                "        hidden = model.relu(model.net1(x.to(dev0)))\n"
                                "        return model.net2(hidden.to(dev1))\n    hidden = model.relu"),
        ["rank 0", "no autograd graph"], 20),
    "evaluate_shards forgets model.eval()": (
        "evaluate_shards", broken("evaluate_shards", "    model.eval()\n", ""),
        ["rank 0 of a world of 1", "training mode", "model.eval()"], 20),
    "evaluate_shards forgets torch.no_grad()": (
        "evaluate_shards", broken("evaluate_shards", "    with torch.no_grad():\n", "    if True:\n"),
        ["rank 0 of a world of 1", "autograd on", "torch.no_grad()"], 20),
    "evaluate_shards does not move the batches to the device": (
        "evaluate_shards", broken("evaluate_shards", "            x, y = x.to(device), y.to(device)\n", ""),
        ["rank 0 of a world of 1", "without being moved to device", "x.to(device)"], 20),
    "evaluate_shards does not all-reduce": (
        "evaluate_shards", broken("evaluate_shards", "    dist.all_reduce(totals)\n", ""),
        ["rank 0", "this rank's own sums", "all_reduce them (SUM)"], 20),
    "evaluate_shards averages the sums": (
        "evaluate_shards", broken("evaluate_shards", "dist.all_reduce(totals)",
                                  "dist.all_reduce(totals)\n    totals /= dist.get_world_size()"),
        ["rank 0", "averaged over the ranks", "instead of summed"], 20),
    "evaluate_shards sums per-batch mean losses": (
        "evaluate_shards", broken("evaluate_shards", 'F.cross_entropy(logits, y, reduction="sum")',
                                  "F.cross_entropy(logits, y)"),
        ["rank 0", "Only the loss sum is wrong", "reduction"], 20),
}

MISTAKES.update({
    "save_and_load: every rank writes": (
        "save_and_load", broken("save_and_load", "    if rank == 0:\n        tmp = path", "    if True:\n        tmp = path"),
        ["rank 1", "wrote a checkpoint too", "only rank 0"], 20),
    "save_and_load: no barrier": (
        "save_and_load", broken("save_and_load", "    dist.barrier()\n", ""),
        ["rank 1", "loaded the older checkpoint", "dist.barrier()"], 20),
    "save_and_load: polls os.path.exists instead of a barrier": (
        "save_and_load", broken("save_and_load", "    dist.barrier()\n",
                                "    import time\n    while not os.path.exists(path):\n        time.sleep(0.01)\n"),
        ["rank 1", "loaded the older checkpoint", "polling os.path.exists"], 20),
    "save_and_load: temporary file in /tmp": (
        "save_and_load", broken("save_and_load", '        tmp = path + ".tmp"\n',
                                "        import tempfile\n        tmp = tempfile.mktemp(dir=os.path.dirname("
                                "os.path.dirname(path)))\n"),
        ["rank 0", "another folder", "within one file system", "checkpoint's own folder"], 20),
    "save_and_load: weights_only=False": (
        "save_and_load", broken("save_and_load", "weights_only=True", "weights_only=False"),
        ["rank 0", "without weights_only=True"], 20),
    "save_and_load: writes straight to path": (
        "save_and_load", broken("save_and_load", "        torch.save(state, tmp)\n        os.replace(tmp, path)\n",
                                "        torch.save(state, path)\n"),
        ["rank 0", "not atomic", "os.replace"], 20),
    "save_and_load: no map_location": (
        "save_and_load", broken("save_and_load", "map_location=device, ", ""),
        ["rank 0", "without map_location"], 20),
})

# Other right answers the checker must accept: name -> (exercise, source, timeout in seconds)
ALSO_RIGHT = {
    "save_and_load loads without weights_only= (torch's default is True since 2.6)": (
        "save_and_load", broken("save_and_load", ", weights_only=True", ""), 20),
    "save_and_load syncs with an all-reduce instead of a barrier": (
        "save_and_load", broken("save_and_load", "    dist.barrier()\n",
                                "    dist.all_reduce(torch.zeros(1, device=device))\n"), 20),
}
