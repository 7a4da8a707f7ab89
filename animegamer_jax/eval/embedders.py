"""Image/text embedders for the CLIP-I / CLIP-T / CLIP-T^E / DreamSim columns.

An :class:`Embedder` is a label plus two functions: ``image(frames uint8 [N, H, W, 3]) -> float
[N, D]`` and ``text(list of N strings) -> float [N, D]`` in one joint space.

- :func:`clip_embedder`: a CLIP model from a local Hugging Face ``CLIPModel`` folder
  (``config.json``, ``model.safetensors`` or ``pytorch_model.bin``, ``vocab.json``, ``merges.txt``),
  converted to our Flax CLIP (``animegamer_jax.models.clip.convert``) and run jitted; text through the folder's
  own BPE tokenizer (``transformers.CLIPTokenizer``, local files only). The paper does not say which
  CLIP scores Table 1 (UNCERTAIN); OpenAI ViT-L/14 is the usual choice for CLIP-I/CLIP-T.
- :func:`standin_embedder`: a deterministic random-feature stand-in used when no CLIP weights are
  given, so the benchmark pipeline runs end to end anywhere. Its label says so, and reports carry
  the label: its numbers are not comparable with the paper's.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
from collections.abc import Callable, Sequence

import numpy as np
from PIL import Image

from animegamer_jax.eval import clip_backend

STANDIN_LABEL = "random-feature stand-in (no CLIP weights given; not comparable with the paper)"


@dataclasses.dataclass(frozen=True)
class Embedder:
    """Joint image/text embedding functions and what they are."""

    label: str
    image: Callable[[np.ndarray], np.ndarray]
    text: Callable[[Sequence[str]], np.ndarray]


def _resize(frames: np.ndarray, size: int) -> np.ndarray:
    return np.stack([np.asarray(Image.fromarray(f).resize((size, size), Image.BILINEAR)) for f in frames])


def standin_embedder(dim: int = 64, seed: int = 0, size: int = 16) -> Embedder:
    """A deterministic stand-in: random projection of a ``size`` x ``size`` thumbnail (images) and a
    hashed bag of words (texts). Identical images embed identically; texts and images share no
    meaning, so CLIP-T values are noise around 0."""
    rng = np.random.default_rng(seed)
    proj = rng.standard_normal((size * size * 3, dim)) / np.sqrt(size * size * 3)

    def image(frames: np.ndarray) -> np.ndarray:
        x = _resize(np.asarray(frames, np.uint8), size).reshape(len(frames), -1).astype(np.float64) / 255.0
        return (x - 0.5) @ proj

    def text(texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), dim))
        for i, t in enumerate(texts):
            for w in re.findall(r"[a-z0-9]+", t.lower()):
                h = int.from_bytes(hashlib.sha256(w.encode()).digest()[:8], "little")
                out[i] += np.random.default_rng(h).standard_normal(dim)
        return out

    return Embedder(STANDIN_LABEL, image, text)


def clip_embedder(path: str, batch_size: int = 16) -> Embedder:
    """CLIP image/text embeddings from a local Hugging Face ``CLIPModel`` folder, run with our Flax CLIP.

    Raises:
      FileNotFoundError: the folder or its weight / tokenizer files are missing.
    """
    image, text = clip_backend.load(path, batch_size)
    return Embedder(f"CLIP {os.path.basename(os.path.normpath(path))} (local HF weights via models.clip.convert)",
                    image, text)


def embedder_from_config(value: str) -> Embedder:
    """The embedder of ``config.eval.clip``: ``""`` or ``"standin"`` -> :func:`standin_embedder`; a
    folder -> :func:`clip_embedder`.

    Raises:
      FileNotFoundError: a path that does not exist.
    """
    if value in ("", "standin"):
        return standin_embedder()
    if not os.path.isdir(value):
        raise FileNotFoundError(f"CLIP folder {value!r} not found. Fix: --config.eval.clip= a local Hugging Face "
                                "CLIPModel folder (config.json, weights, vocab.json, merges.txt) or standin")
    return clip_embedder(value)
