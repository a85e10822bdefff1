"""Models used across the lessons, small enough to train on a 2-core CPU: the one home of models.

One module per model family; every name is importable from ``ddp_tutorial.models`` itself:

- ``small``: ``ToyModel`` (``07_ddp_spawn``), ``DeepMLP``, ``SharedLayerNet`` and ``make_model``, the
  data-parallel lessons' registry with each model's (in, out) features;
- ``vision``: ``SmallCNN``, ``resnet18_small`` and ``build_model``, the ``--model`` of
  ``python -m ddp_tutorial.training.train`` (``11_train_end_to_end``);
- ``transformer``: ``Block``, ``TinyTransformer``, ``TinyGPT``, ``token_batch`` and the hand-written
  layers of ZeRO-3 from scratch (``14_sharding``, ``17_memory``, ``18_zero3_and_checkpoints``);
- ``llama``: ``TinyLlama`` and its parts, ``tp_heads`` (``20_long_sequences``);
- ``moe``: ``MixtureOfExperts``, ``TinyMoENet`` (``21_expert_parallel``);
- ``gpt``: ``CharGPT``, ``rotary`` (``22_capstone``).
"""

from ddp_tutorial.models.gpt import CharGPT, GPTAttention, GPTBlock, GPTFeedForward, rotary
from ddp_tutorial.models.llama import LlamaAttention, LlamaBlock, SwiGLU, TinyLlama, tp_heads
from ddp_tutorial.models.moe import ExpertMLP, MixtureOfExperts, TinyMoENet, top_k_gates
from ddp_tutorial.models.small import DeepMLP, SharedLayerNet, ToyModel, make_model
from ddp_tutorial.models.transformer import Block, EinsumLinear, LookupMLP, TinyGPT, TinyTransformer, token_batch
from ddp_tutorial.models.vision import TRAIN_MODELS, SmallCNN, build_model, resnet18_small

__all__ = [
    "TRAIN_MODELS", "Block", "CharGPT", "DeepMLP", "EinsumLinear", "ExpertMLP", "GPTAttention", "GPTBlock",
    "GPTFeedForward", "LlamaAttention", "LlamaBlock", "LookupMLP", "MixtureOfExperts", "SharedLayerNet",
    "SmallCNN", "SwiGLU", "TinyGPT", "TinyLlama", "TinyTransformer", "TinyMoENet", "ToyModel", "build_model", "make_model",
    "resnet18_small", "rotary", "token_batch", "top_k_gates", "tp_heads",
]
