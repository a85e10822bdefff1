"""Typical wrong answers to lesson 18's exercises (ZeRO-3 linear layer, resharding load), and the words their diagnosis must contain.

Same format as ``exercise_mistakes``: ``(exercise, source, words, timeout in seconds)``.
"""

from __future__ import annotations

from exercise_mistakes import broken

SCATTER = "        reduce_scatter_single(grad_shard, padded)  # my slice, summed over the ranks\n"
SAVE = "        ctx.save_for_backward(x, shard)  # not the full weight: it is freed when forward returns\n"
GATHER_AGAIN = ("        x, shard = ctx.saved_tensors\n"
                "        weight = gathered_weight(shard, ctx.shape)  # the second all-gather\n")

MISTAKES = {
    "zero3 all-reduces the full gradient, then slices": (
        "zero3_linear", broken("zero3_linear", SCATTER,
                                "        dist.all_reduce(padded)\n"
                                "        s = shard.numel()\n"
                                "        grad_shard = padded[dist.get_rank() * s:(dist.get_rank() + 1) * s]\n"),
        ["world of 1", "the numbers are right, but it all-reduces", "Reduce-scatter it"], 20),
    "zero3 keeps the full weight for backward": (
        "zero3_linear", broken("zero3_linear", SAVE, "        ctx.save_for_backward(x, weight)\n")
        .replace(GATHER_AGAIN, "        x, weight = ctx.saved_tensors\n        shard = ctx.shard\n")
        .replace("        ctx.shape = shape\n", "        ctx.shape, ctx.shard = shape, shard\n"),
        ["world of 1", "still alive", "saved for backward (ctx.save_for_backward)", "holds only its shard"], 20),
    # the loophole of the review (lessons-17-19 section 4, 1.2): the full weight saved, and a gather thrown away
    "zero3 saves the full weight and adds a throwaway all-gather in backward": (
        "zero3_linear", broken("zero3_linear", SAVE, "        ctx.save_for_backward(x, shard, weight)\n")
        .replace(GATHER_AGAIN, "        x, shard, weight = ctx.saved_tensors\n"
                               "        gathered_weight(shard, ctx.shape)  # gathered, never used\n"),
        ["world of 1", "still alive", "saved for backward (ctx.save_for_backward)", "holds only its shard"], 20),
    "zero3 keeps the full weight on ctx and adds a throwaway all-gather": (
        "zero3_linear", broken("zero3_linear", SAVE, "        ctx.save_for_backward(x, shard)\n        ctx.weight = weight\n")
        .replace(GATHER_AGAIN, "        x, shard = ctx.saved_tensors\n"
                               "        gathered_weight(shard, ctx.shape)  # gathered, never used\n"
                               "        weight = ctx.weight\n"),
        ["world of 1", "still alive", "kept outside autograd's saved tensors", "holds only its shard"], 20),
    "zero3 caches a copy of the full weight in a module-level dict": (
        "zero3_linear", broken("zero3_linear", SAVE, "        ctx.save_for_backward(x, shard)\n"
                                                      "        CACHE[id(shard)] = weight.clone()\n")
        .replace(GATHER_AGAIN, "        x, shard = ctx.saved_tensors\n"
                               "        gathered_weight(shard, ctx.shape)  # gathered, never used\n"
                               "        weight = CACHE.pop(id(shard))\n")
        .replace("class GatheredLinear", "CACHE = {}\n\n\nclass GatheredLinear"),
        ["world of 1", "still alive", "kept outside autograd's saved tensors", "holds only its shard"], 20),
    "zero3 sums instead of averaging": (
        "zero3_linear", broken("zero3_linear", "return grad_x, grad_shard / n, None", "return grad_x, grad_shard, None"),
        ["world of 2", "2 times the mean", "divide by the world size"], 20),
}

# Exercise 18.2 (load_resharded): the reference's four calls, and wrong ways around them
IMPORTS = "from torch.distributed.checkpoint.state_dict import (\n"
LOAD = ('    state = {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, optimizer)}\n'
        "    dcp.load(state, checkpoint_id=path)  # in place: each rank reads the byte ranges of its own shards\n"
        '    set_model_state_dict(model, state["model"])\n'
        '    set_optimizer_state_dict(model, optimizer, state["optim"])  # the tensors and the lr\n')


def export_load(body: str) -> str:
    """The reference with its four calls replaced by ``body``, which may use a single-file export."""
    source = broken("load_resharded", LOAD, body)
    return source.replace(IMPORTS, "import torch.distributed as dist\nfrom torch.distributed.checkpoint.format_utils "
                                   "import dcp_to_torch_save\n" + IMPORTS.replace("(\n", "(\n    StateDictOptions,\n"))


EXPORT = ('    export = path + ".pt"\n'
          "    if dist.get_rank() == 0:\n"
          "        dcp_to_torch_save(path, export)  # one file with every whole tensor\n"
          "    dist.barrier()\n")
SET_FULL = ('    set_model_state_dict(model, state["model"], options=options)\n'
            '    set_optimizer_state_dict(model, optimizer, state["optim"], options=options)\n')

MISTAKES |= {
    "load_resharded: every rank torch.loads a single-file export": (
        "load_resharded", export_load(EXPORT + "    state = torch.load(export, weights_only=True)\n"
                                      "    options = StateDictOptions(full_state_dict=True)\n" + SET_FULL),
        ["world of 1", "the numbers are right", "every rank torch.loads a single-file export",
         "every rank holds the whole model"], 60),
    "load_resharded: torch.load with weights_only=False": (
        "load_resharded", export_load(EXPORT + "    state = torch.load(export, weights_only=False)\n"
                                      "    options = StateDictOptions(full_state_dict=True)\n" + SET_FULL),
        ["weights_only=False", "run its code on every rank"], 60),
    "load_resharded: rank 0 loads and broadcasts": (
        "load_resharded", export_load(EXPORT + "    state = torch.load(export, weights_only=True) if dist.get_rank() == 0 "
                                      'else {"model": {}, "optim": {}}\n'
                                      "    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)\n"
                                      + SET_FULL),
        ["rank 0 loads the whole model and broadcasts it", "broadcast_from_rank0=True"], 60),
    "load_resharded: dcp.load into a state dict never set back": (
        "load_resharded", broken("load_resharded", LOAD, LOAD.split("    set_model")[0]),
        ["Adam's lr is 0.001, the checkpoint's 0.01", "set_optimizer_state_dict was never called"], 60),
    "load_resharded: the optimizer is not loaded": (
        "load_resharded", broken("load_resharded", LOAD,
                                 '    state = {"model": get_model_state_dict(model)}\n'
                                 "    dcp.load(state, checkpoint_id=path)\n"
                                 '    set_model_state_dict(model, state["model"])\n'),
        ["world of 1", "Adam has no state after the load", "the optimizer was not loaded"], 60),
    "load_resharded: the model's state dict is never set back": (
        "load_resharded", broken("load_resharded", LOAD, LOAD.replace('    set_model_state_dict(model, state["model"])\n', "")),
        ["the numbers are right, but set_model_state_dict was never called", "fills in place"], 60),
}

# Other right answers (each must pass): (exercise, source, timeout in seconds)
ALSO_RIGHT = {
    "zero3_linear keeping the input and the shard as attributes of ctx": (
        "zero3_linear", broken("zero3_linear", SAVE, "        ctx.x, ctx.shard = x, shard\n")
        .replace(GATHER_AGAIN, "        x, shard = ctx.x, ctx.shard\n"
                               "        weight = gathered_weight(shard, ctx.shape)\n"), 20),
    "load_resharded with get_state_dict and set_state_dict (lesson 18's TrainingState)": (
        "load_resharded", broken("load_resharded", LOAD,
                                 "    model_state, optim_state = get_state_dict(model, optimizer)\n"
                                 '    state = {"model": model_state, "optim": optim_state}\n'
                                 "    dcp.load(state, checkpoint_id=path)\n"
                                 '    set_state_dict(model, optimizer, model_state_dict=state["model"], '
                                 'optim_state_dict=state["optim"])\n')
        .replace(IMPORTS, IMPORTS + "    get_state_dict,\n    set_state_dict,\n"), 60),
}
