"""Reference pairs for reference conditioning: each clip gets the first frame of ANOTHER clip of the same
character as its reference image, from another scene wherever the character has one.

A clip's character is its first labelled character (its protagonist); clips that show nobody get no
reference. The choice is deterministic: a hash of (seed, film_id, clip_index) picks among the candidates
sorted by (film_id, scene_id, clip_index), so a clip's reference depends on its seed and the set of clips,
not on their order.

  refs = references.dataset_references("data/prepared/toy_train", "train", seed=0)   # int64 [N]
  source = datasets.open_split("data/prepared/toy_train", "train")
  ref_frames = references.reference_frames(source, refs, [0, 5, 7])                  # uint8 [3, H, W, 3]
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence

import numpy as np

from animegamer_jax.io import fileio
from animegamer_jax.data import datasets, label_schema


def _draw(seed: int, film_id: str, clip_index: int, n: int) -> int:
    """A stable draw in [0, n) from (seed, film_id, clip_index) (sha256; Python's hash() is salted)."""
    digest = hashlib.sha256(f"{int(seed)}/{film_id}/{int(clip_index)}".encode()).digest()
    return int.from_bytes(digest[:8], "little") % n


def mine_references(clips: Sequence[Mapping], seed: int = 0) -> np.ndarray:
    """The reference clip of every clip.

    Args:
      clips: one row per clip (e.g. a split's metadata rows in record order), each with ``film_id``,
        ``scene_id``, ``clip_index`` and ``characters`` (names; the first is the clip's character).
      seed: picks among the candidates.

    Returns:
      int64 [N]: for clip i the row index j != i of a clip of the same character from another (film, scene)
      when the character has one, else from the same scene; -1 when clip i shows nobody or is its
      character's only clip.
    """
    groups: dict[str, list[int]] = {}
    for i, c in enumerate(clips):
        if c["characters"]:
            groups.setdefault(str(c["characters"][0]), []).append(i)
    out = np.full(len(clips), -1, np.int64)
    for members in groups.values():
        members.sort(key=lambda j: (str(clips[j]["film_id"]), int(clips[j]["scene_id"]), int(clips[j]["clip_index"])))
        scene_of = [(str(clips[j]["film_id"]), int(clips[j]["scene_id"])) for j in members]
        first: dict[tuple[str, int], int] = {}
        count: dict[tuple[str, int], int] = {}
        for pos, s in enumerate(scene_of):
            first.setdefault(s, pos)
            count[s] = count.get(s, 0) + 1
        for pos, j in enumerate(members):
            a, n = first[scene_of[pos]], count[scene_of[pos]]
            draw = lambda m: _draw(seed, str(clips[j]["film_id"]), int(clips[j]["clip_index"]), m)  # noqa: E731
            if len(members) > n:  # another scene: skip this scene's run [a, a + n)
                k = draw(len(members) - n)
                out[j] = members[k if k < a else k + n]
            elif n > 1:  # only this scene: another clip of it
                k = draw(n - 1)
                out[j] = members[a + (k if a + k < pos else k + 1)]
    return out


def clips_with_characters(dataset_dir: str, split: str = "train", labels_path: str = "") -> list[dict]:
    """A prepared split's clip rows (datasets.read_index, record order) with each clip's ``characters``
    (tuple of names) joined from the labels file it was prepared with (``labels_path``: another copy of it).

    Raises:
      FileNotFoundError: the labels file is gone (pass labels_path); ValueError: a clip without a label.
    """
    index = datasets.read_index(dataset_dir, split)
    path = labels_path or str(index.get("labels", ""))
    if not path or not fileio.exists(path):
        raise FileNotFoundError(f"{dataset_dir}: its labels file {path!r} is not there; pass labels_path= (the "
                                f"labels JSONL it was prepared with)")
    labels = label_schema.read_labels(path)
    rows = []
    for row in index["clips"]:
        label = labels.clips.get((row["film_id"], int(row["clip_index"])))
        if label is None:
            raise ValueError(f"{path}: no label for film '{row['film_id']}' clip {row['clip_index']} of {dataset_dir} "
                             f"(labels of another preparation?)")
        rows.append({**row, "characters": label.characters})
    return rows


def dataset_references(dataset_dir: str, split: str = "train", seed: int = 0, labels_path: str = "") -> np.ndarray:
    """int64 [N]: the record index (in ``split``) of every record's reference clip, -1 for none
    (:func:`mine_references` on :func:`clips_with_characters`)."""
    return mine_references(clips_with_characters(dataset_dir, split, labels_path), seed)


def reference_frames(source, refs: np.ndarray, indices: Sequence[int]) -> np.ndarray:
    """uint8 [B, H, W, 3]: the first frame of the reference clip of each record of ``indices``, read from
    ``source`` (datasets.open_split); a record without a reference (-1) gets its own first frame."""
    return np.stack([np.asarray(source[int(refs[i]) if refs[i] >= 0 else int(i)]["frames"][0]) for i in indices])
