"""Identity accuracy: which of K character references each generated clip looks like.

For each clip, the mean cosine between its sampled frames and each reference image in an image
embedding (an :class:`embedders.Embedder`'s ``image``: CLIP with local weights, else the labelled
random-feature stand-in, the features CLIP-I uses; ``metrics.cosine_matrix``); the clip's predicted
character is the reference of the highest mean. Accuracy is the share of clips whose predicted
character is the one the turn named; chance is 1/K.

  names, refs, heldout = identity.toy_references("data/prepared/toy")         # K names, uint8 [K, H, W, 3]
  res = identity.identity_accuracy(clips, [names.index(n) for n in named], refs, embedder.image)
  res["accuracy"], res["chance"]                                               # e.g. 0.75, 0.125
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from animegamer_jax.data import toy_world
from animegamer_jax.eval import metrics


def toy_references(world_dir: str) -> tuple[list[str], np.ndarray, list[bool]]:
    """The K references of a toy world (``characters/<Name>/reference.png``, data/toy_world.py):
    (names in the manifest's order, uint8 [K, H, W, 3], held-out flags).

    Raises:
      FileNotFoundError / ValueError: no finished toy world at ``world_dir`` (one line).
    """
    chars = toy_world.read_manifest(world_dir)["characters"]
    names = [str(c["name"]) for c in chars]
    return names, np.stack([toy_world.load_reference(world_dir, n) for n in names]), [bool(c["heldout"]) for c in chars]


def identity_scores(clips: Sequence[np.ndarray], references: np.ndarray,
                    image_embed: Callable[[np.ndarray], np.ndarray], frames_per_clip: int = 4) -> np.ndarray:
    """float64 [N, K]: for each clip (uint8 [T, H, W, 3]) the mean cosine between its
    ``frames_per_clip`` evenly spaced frames (all when <= 0; ``metrics.sample_frame_indices``) and each
    reference (uint8 [K, H', W', 3]; any size the embedder takes) in ``image_embed``'s space.

    Raises:
      ValueError: no references, or a clip that is not [T, H, W, 3].
    """
    refs = np.asarray(references)
    if refs.ndim != 4 or not len(refs):
        raise ValueError(f"references must be uint8 [K, H, W, 3] with K >= 1, got shape {refs.shape}")
    ref_emb = image_embed(refs.astype(np.uint8))
    out = np.zeros((len(clips), len(refs)))
    for i, clip in enumerate(clips):
        clip = np.asarray(clip)
        if clip.ndim != 4 or clip.shape[-1] != 3:
            raise ValueError(f"clip {i}: expected uint8 [T, H, W, 3], got shape {clip.shape}")
        frames = clip[metrics.sample_frame_indices(len(clip), frames_per_clip)].astype(np.uint8)
        out[i] = metrics.cosine_matrix(image_embed(frames), ref_emb).mean(axis=0)
    return out


def identity_accuracy(clips: Sequence[np.ndarray], named: Sequence[int], references: np.ndarray,
                      image_embed: Callable[[np.ndarray], np.ndarray], frames_per_clip: int = 4) -> dict:
    """Identity accuracy of ``clips`` whose turns named the characters ``named`` (index into
    ``references``, one per clip): {"accuracy": share in [0, 1], "chance": 1 / K, "num_clips": N,
    "predicted": [K index per clip], "per_character": {index: {"accuracy", "num_clips"}}}
    (:func:`identity_scores`; ties go to the lower index).

    Raises:
      ValueError: ``named`` of another length than ``clips``, an index outside [0, K), or no clips.
    """
    named = [int(k) for k in named]
    k = len(references)
    if len(named) != len(clips) or not clips:
        raise ValueError(f"need one named character per clip and at least one clip: {len(clips)} clips, "
                         f"{len(named)} names")
    if any(not 0 <= n < k for n in named):
        raise ValueError(f"named characters {named} must index the {k} references")
    pred = identity_scores(clips, references, image_embed, frames_per_clip).argmax(axis=1)
    hit = pred == np.asarray(named)
    per = {c: {"accuracy": float(hit[np.asarray(named) == c].mean()), "num_clips": int((np.asarray(named) == c).sum())}
           for c in sorted(set(named))}
    return {"accuracy": float(hit.mean()), "chance": 1.0 / k, "num_clips": len(clips),
            "predicted": [int(p) for p in pred], "per_character": per}
