"""CLIP embeddings for the metrics from a local Hugging Face ``CLIPModel`` folder, run with our Flax CLIP.

The weights go through the project's converter (``animegamer_jax.models.clip.convert``: HF names -> ours,
loud on mismatch) into ``animegamer_jax.models.clip.model.CLIP``; the text goes through the folder's own
BPE tokenizer (``CLIPTokenizer.from_pretrained(folder)``, local files only; transformers 5 ignores a
bare ``vocab_file`` argument, docs/evaluation.md#metrics). No network access.

Image preprocessing for the metrics is the standard CLIP evaluation one: the centre square of the
frame (CLIP's resize-shortest-side + centre-crop), resized bicubic with antialiasing to the model's
input size, then the CLIP mean/std normalization (``models.clip.model.preprocess``). The shot encoder's
no-crop squash (docs/encoders.md#clip-image-tower) is a training-time convention and is not used for scoring.

:func:`load` returns the image and text functions; ``eval.embedders.clip_embedder`` labels them as an
``Embedder``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from PIL import Image

from animegamer_jax.io import media
from animegamer_jax.models.clip import convert as convert_clip
from animegamer_jax.models.clip.model import preprocess
from animegamer_jax.weights import load_state_dict


def center_square(frames: np.ndarray) -> np.ndarray:
    """uint8 [N, H, W, 3] -> the centred [N, S, S, 3] crop with S = min(H, W)."""
    _, h, w, _ = frames.shape
    s = min(h, w)
    y, x = (h - s) // 2, (w - s) // 2
    return frames[:, y:y + s, x:x + s]


def load(path: str, batch_size: int = 16) -> tuple[Callable[[np.ndarray], np.ndarray],
                                                    Callable[[Sequence[str]], np.ndarray]]:
    """The CLIP image and text embedding functions of a local HF ``CLIPModel`` folder.

    Args:
      path: folder with ``config.json``, ``*.safetensors`` or ``*.bin`` and the tokenizer files.
      batch_size: images / texts per jitted call (inputs are padded to it: one compile each).

    Returns:
      ``(image, text)``: ``image(frames uint8 [N, H, W, 3]) -> float32 [N, D]`` and
      ``text(list of N strings) -> float32 [N, D]``, in CLIP's joint space.

    Raises:
      FileNotFoundError: missing config, weights or tokenizer files.
      animegamer_jax.weights.ConversionError: weights that do not match the config.
    """
    from transformers import CLIPTokenizer  # optional

    cfg_path = os.path.join(path, "config.json")
    if not os.path.isfile(cfg_path):
        raise FileNotFoundError(f"{path}: no config.json; pass a Hugging Face CLIPModel folder")
    with open(cfg_path) as f:
        hf_cfg = json.load(f)
    cfg = convert_clip.config_from_hf(hf_cfg, dtype="float32")
    model = convert_clip.load_clip(load_state_dict(path), cfg)
    if not (os.path.isfile(os.path.join(path, "vocab.json")) or os.path.isfile(os.path.join(path, "tokenizer.json"))):
        raise FileNotFoundError(f"{path}: no tokenizer files (vocab.json + merges.txt or tokenizer.json)")
    tokenizer = CLIPTokenizer.from_pretrained(path, local_files_only=True)
    graphdef, state = nnx.split(model)
    size = cfg.image_size

    @jax.jit
    def _image(state, frames_u8):
        m = nnx.merge(graphdef, state)
        x = media.from_uint8(frames_u8)  # uint8 -> [-1, 1], inside the jitted program
        return m.encode_image(preprocess(x, size))

    @jax.jit
    def _text(state, ids):
        return nnx.merge(graphdef, state).encode_text(ids)

    def _batched(fn, x: np.ndarray) -> np.ndarray:
        out = []
        for i in range(0, len(x), batch_size):
            chunk = x[i:i + batch_size]
            pad = batch_size - len(chunk)
            if pad:
                chunk = np.concatenate([chunk, np.repeat(chunk[-1:], pad, axis=0)])
            out.append(np.asarray(fn(state, jnp.asarray(chunk)))[:batch_size - pad])
        return np.concatenate(out)

    def image(frames: np.ndarray) -> np.ndarray:
        sq = center_square(np.asarray(frames, np.uint8))
        # one resize to a fixed side first keeps a single compiled shape for any frame size
        sq = np.stack([np.asarray(Image.fromarray(f).resize((size, size), Image.BICUBIC)) for f in sq])
        return _batched(_image, sq)

    def text(texts: Sequence[str]) -> np.ndarray:
        ids = tokenizer(list(texts), padding="max_length", truncation=True,
                        max_length=cfg.text_context_length)["input_ids"]
        return _batched(_text, np.asarray(ids, np.int32))

    return image, text
