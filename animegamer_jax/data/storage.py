"""On-disk clip dataset: ArrayRecord shards + one JSON index (a TFDS-free equivalent of a TFDS
ArrayRecord builder; grain reads it with `grain.sources.ArrayRecordDataSource`).

Layout of a dataset directory:
  dataset.json                      index: format, config used, shards, films, one row per clip
                                    (everything but pixels/features), skipped films
  clips.array_record-00000-of-0000N shards; global record i = i-th record of the shards concatenated

Clips of a film are consecutive records in timestamp order, so a multi-turn sequence is a run of
consecutive indices with one film_id.

Record encoding (no pickle, no TensorFlow): b"AGC1", uint32 little-endian header length, a JSON header
{"arrays": {name: [dtype, shape, offset, nbytes]}, "values": {name: JSON value}}, then the raw
C-order array bytes. Fields of a clip record:
  frames       uint8 [T, H, W, 3]  RGB clip frames
  first_frame  uint8 [H, W, 3]     = frames[0] (the shot encoder's visual reference)
  frame_times  float32 [T]         seconds from film start of each frame
  states       int32 [4]           [ML, SC, ET, ST] (motion level 1..5; state changes -5..5)
  motion_scope float32 []          see motion.py
  film_id str, scene_id int, clip_index int, start_time float, end_time float (s), motion_level int,
  characters list[str], action str, background str, instruction str,
  plus any extra float/int arrays (precomputed features, e.g. VAE latents, E_a embeddings).
"""

from __future__ import annotations

import hashlib
import json
import os
import struct

import numpy as np

from animegamer_jax import paths

MAGIC = b"AGC1"
INDEX_FILE = "dataset.json"
FORMAT = "animegamer_jax.clips/1"


class DatasetError(ValueError):
    """A dataset directory is missing, incomplete or of another format."""


def encode_record(arrays: dict[str, np.ndarray], values: dict) -> bytes:
    """Serializes numpy arrays + JSON-able values into one record (see the module docstring)."""
    header = {"arrays": {}, "values": values}
    chunks, offset = [], 0
    for name, arr in arrays.items():
        arr = np.asarray(arr)
        if not arr.flags.c_contiguous:
            arr = arr.copy(order="C")
        header["arrays"][name] = [arr.dtype.str, list(arr.shape), offset, arr.nbytes]
        chunks.append(arr.tobytes())
        offset += arr.nbytes
    head = json.dumps(header, separators=(",", ":")).encode()
    return MAGIC + struct.pack("<I", len(head)) + head + b"".join(chunks)


def decode_record(data: bytes) -> dict:
    """Inverse of encode_record: one flat dict of numpy arrays (writable copies) and values."""
    if data[:4] != MAGIC:
        raise DatasetError(f"record does not start with {MAGIC!r}: not an animegamer_jax clip record")
    (n,) = struct.unpack("<I", data[4:8])
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = dict(header["values"])
    for name, (dtype, shape, offset, nbytes) in header["arrays"].items():
        buf = np.frombuffer(data, dtype=np.dtype(dtype), count=int(np.prod(shape, dtype=np.int64)),
                            offset=base + offset)
        out[name] = buf.reshape(shape).copy()
    return out


def shard_name(k: int, n: int) -> str:
    return f"clips.array_record-{k:05d}-of-{n:05d}"


def read_index(dataset_dir: str) -> dict:
    """Loads dataset.json of a prepared dataset.

    Raises:
      DatasetError: no such dataset / not built by prepare / shards missing.
    """
    dataset_dir = paths.resource(dataset_dir)
    path = paths.as_path(dataset_dir) / INDEX_FILE
    if not path.is_file():
        raise DatasetError(f"{dataset_dir}: not a prepared dataset (no {INDEX_FILE}); build it with "
                           f"`python -m animegamer_jax.data.prepare`")
    index = json.loads(path.read_text(encoding="utf-8"))
    if index.get("format") != FORMAT:
        raise DatasetError(f"{path}: format {index.get('format')!r}, expected {FORMAT!r}")
    for shard in index["shards"]:
        if not (path.parent / shard["file"]).is_file():
            raise DatasetError(f"{dataset_dir}: shard {shard['file']} is missing")
    return index


def dataset_fingerprint(index: dict) -> str:
    """``"sha256:<16 hex>"`` of what a prepared dataset holds, from its index (:func:`read_index`): the
    clip config, the clip rows (film, times, instruction, states, motion) and the feature fields, not
    where it lies (film and label paths), so a copy or a move has the same fingerprint and a dataset
    prepared again from other films or labels has another one. Used by training to refuse resuming
    on other data (``train.pipeline.run_meta``)."""
    content = {k: index.get(k) for k in ("config", "num_clips", "clips", "feature_fields")}
    digest = hashlib.sha256(json.dumps(content, sort_keys=True).encode("utf-8")).hexdigest()
    return f"sha256:{digest[:16]}"


def shard_paths(dataset_dir: str, index: dict | None = None) -> list[str]:
    """Absolute shard paths in global-index order.

    Raises:
      DatasetError: ``dataset_dir`` is a URL: open-source ArrayRecord reads local files only, so a
        dataset in a bucket is read through a FUSE mount (the message gives the command).
    """
    dataset_dir = paths.resource(dataset_dir)
    if paths.is_url(dataset_dir):
        bucket = dataset_dir.split("://", 1)[1].split("/", 1)[0]
        raise DatasetError(
            f"{dataset_dir}: ArrayRecord shards cannot be read from a URL (array_record opens local files). "
            f"Fix: mount the bucket, e.g. `gcsfuse --implicit-dirs {bucket} /gcs/{bucket}`, and pass "
            f"/gcs/{dataset_dir.split('://', 1)[1]} (checkpoints, TensorBoard and outputs can stay on gs://)")
    index = index or read_index(dataset_dir)
    return [os.path.abspath(os.path.join(dataset_dir, s["file"])) for s in index["shards"]]
