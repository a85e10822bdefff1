"""The capstone's data: character-level text made by a fixed grammar, no download (``22_capstone``).

``corpus()`` writes a few thousand characters of short sentences ("the red fox sees two
small birds.") from word lists, chosen by ``random.Random(seed)``, whose sequence for a seed
is the same on every platform and Python release. The alphabet is fixed (``ALPHABET``: 32
characters), so the vocabulary, and every shape that depends on it, is known before any
text is read. ``char_batch`` cuts a step's global batch of windows out of the text; every rank
draws the same windows and keeps its rows, so one process can train on exactly what all
ranks saw together.

    python -m ddp_tutorial.capstone.chars        # a sample of the text and its size
"""

from __future__ import annotations

import argparse
import random
from functools import lru_cache

import torch

__all__ = ["ALPHABET", "VOCAB", "corpus", "encode", "decode", "char_batch", "main"]

ALPHABET = " .,abcdefghijklmnopqrstuvwxyz?!\n"  # 32 characters: every size over 1, 2, 4 ranks stays whole
VOCAB = len(ALPHABET)
_INDEX = {c: i for i, c in enumerate(ALPHABET)}

_WORDS = {
    "det": ["the", "a", "one", "two", "my", "your"],
    "adj": ["red", "small", "quick", "old", "happy", "quiet", "big", "blue"],
    "noun": ["fox", "bird", "cat", "dog", "tree", "river", "child", "ship"],
    "verb": ["sees", "likes", "follows", "finds", "hears", "meets"],
    "end": [".", ".", ".", "!", "?"],
}


def _sentence(rng: random.Random) -> str:
    """One sentence: determiner, maybe an adjective, noun, verb, determiner, noun, a stop."""
    def phrase() -> str:
        words = [rng.choice(_WORDS["det"])]
        if rng.random() < 0.5:
            words.append(rng.choice(_WORDS["adj"]))
        return " ".join(words + [rng.choice(_WORDS["noun"])])

    return f"{phrase()} {rng.choice(_WORDS['verb'])} {phrase()}{rng.choice(_WORDS['end'])}"


@lru_cache(maxsize=4)
def corpus(sentences: int = 400, seed: int = 0) -> str:
    """``sentences`` sentences of the grammar, eight to a line; the same text for a seed everywhere."""
    rng = random.Random(seed)
    said = [_sentence(rng) for _ in range(sentences)]
    return "\n".join(" ".join(said[i:i + 8]) for i in range(0, sentences, 8)) + "\n"


def encode(text: str) -> torch.Tensor:
    """Characters -> indices into ``ALPHABET`` (int64); a character outside it raises ``ValueError``."""
    missing = sorted(set(text) - set(ALPHABET))
    if missing:
        raise ValueError(f"characters outside the alphabet: {missing!r}")
    return torch.tensor([_INDEX[c] for c in text], dtype=torch.int64)


def decode(indices: torch.Tensor) -> str:
    """Indices -> text."""
    return "".join(ALPHABET[i] for i in indices.tolist())


def char_batch(step: int, global_batch: int, seq: int, *, part: int = 0, parts: int = 1,
               seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Step ``step``'s windows of ``seq + 1`` characters: inputs and next-character targets (rows, seq).

    The whole global batch is drawn from the step number, then rows ``part`` of ``parts`` equal
    slices are kept (a data-parallel rank's share; ``parts=1``: everything).
    """
    if global_batch % parts:
        raise ValueError(f"global_batch={global_batch} does not split into {parts} equal parts")
    text = encode(corpus(seed=seed))
    gen = torch.Generator().manual_seed(10_000 * seed + step)
    starts = torch.randint(0, len(text) - seq - 1, (global_batch,), generator=gen)
    windows = torch.stack([text[s:s + seq + 1] for s in starts.tolist()])
    rows = global_batch // parts
    windows = windows[part * rows:(part + 1) * rows]
    return windows[:, :-1], windows[:, 1:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    text = corpus(seed=args.seed)
    print(f"{len(text)} characters, {len(set(text))} distinct of an alphabet of {VOCAB}; the first lines:")
    print("".join(text.splitlines(keepends=True)[:2]), end="")


if __name__ == "__main__":
    main()
