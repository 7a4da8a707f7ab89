"""The feature dataset: the shot encoder's frozen inputs per clip of a clip dataset, as a tfds Beam builder.

Built by ``python -m animegamer_jax.commands.data extract-features``, which supplies the models; read by
``data/loader.py`` (``ClipSource(dataset, features_dir=...)``) through ``tfds.builder_from_directory``.
One record per clip of the clip dataset, in the same splits and the same order, so record ``i`` of a
split holds clip ``i``'s features:

  index  int32 []          the clip's record index in the clip dataset's split (the loader checks it)
  f_v    float [P, Dv]     CLIP penultimate patch tokens of the clip's first frame (docs/encoders.md)
  f_md   float [Lt, Dt]    T5 encoder output of the clip's action text (docs/encoders.md)

float is float32 or float16 (the BuilderConfig, named from the sizes: ``"196x768-30x4096-float32"``).
metadata.json: format, the clip dataset's path, per split its clip count and fingerprint
(``datasets.dataset_fingerprint``), text_field, the run's config sections and weights, and the
pipeline's counters (``animegamer/clips_encoded``, ``animegamer/batches_encoded``).

Pipeline: each split's record indices cut up front into shards of ``SHARD_BATCHES`` batches of
``batch_size`` -> ``Reshuffle`` (shards spread over workers) -> :class:`EncodeClips`, which encodes a
shard batch by batch and appends each clip's features to the shard's own file as it goes
(``shards.py``: nothing shuffled through the runner). Fixed ranges rather than
``beam.BatchElements``: BatchElements batches within a bundle, so bundle ends give short batches of
any size (one XLA compile per size); fixed ranges give full batches and one short last batch per
shard, padded to ``batch_size`` so the jitted program compiles once per worker; a shard is also a
run of consecutive records, read in order from the clip dataset.

The models are not imported here: :class:`EncodeClips` calls a ``load_encoder`` factory (picklable,
``extract_features.ModelLoader``) once per worker, so this module knows the dataset, not the networks.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Iterator
from typing import Protocol

import apache_beam as beam
import numpy as np
import tensorflow_datasets as tfds

from animegamer_jax.data import beam_util, datasets, loader
from animegamer_jax.data.clip_dataset import shards

NAME = "animegamer_clip_features"
#: metadata.json["format"] of a feature dataset
FORMAT = loader.FEATURES_FORMAT
#: the record fields besides ``index``
FIELDS = ("f_v", "f_md")
DTYPES = ("float32", "float16")
DESCRIPTION = ("Per clip of an AnimeGamer clip dataset (animegamer_clips), the shot encoder's frozen inputs: "
               "f_v, the CLIP ViT penultimate patch tokens of the clip's first frame, and f_md, the T5 encoder "
               "output of its action text. Record i of a split belongs to record i of the same split of the clip "
               "dataset named in metadata.json. Built by `python -m animegamer_jax.commands.data extract-features`.")


class ClipEncoder(Protocol):
    """First frames uint8 (B, H, W, 3) and T5 ids int32 (B, Lt) -> f_v (B, P, Dv), f_md (B, Lt, Dt) as numpy."""

    def __call__(self, frames: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]: ...


#: () -> (encoder, tokenize: texts -> (B, Lt) int32 T5 ids); called once per worker
LoadEncoder = Callable[[], tuple[ClipEncoder, Callable[[list[str]], np.ndarray]]]


@dataclasses.dataclass(eq=False)
class FeaturesConfig(tfds.core.BuilderConfig):
    """Shapes and dtype of the features; ``name`` is derived by :func:`features_config`."""

    num_patches: int = 16
    vision_width: int = 32
    text_length: int = 8
    text_dim: int = 32
    dtype: str = "float32"


def features_config(num_patches: int, vision_width: int, text_length: int, text_dim: int,
                    dtype: str = "float32") -> FeaturesConfig:
    """FeaturesConfig named from the sizes, e.g. ``"196x768-30x4096-float32"``.

    Raises:
      ValueError: a dtype not in DTYPES.
    """
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    name = f"{num_patches}x{vision_width}-{text_length}x{text_dim}-{dtype}"
    return FeaturesConfig(name=name, description=f"f_v ({num_patches}, {vision_width}), f_md ({text_length}, "
                          f"{text_dim}), {dtype}", num_patches=int(num_patches), vision_width=int(vision_width),
                          text_length=int(text_length), text_dim=int(text_dim), dtype=dtype)


#: batches per shard of the feature dataset (a unit of work of one worker)
SHARD_BATCHES = 16


class EncodeClips(beam.DoFn):
    """(split, start, stop) record range of a split -> one JSON report line; writes the range's features to
    its part file (shards.PartWriter), batch by batch.

    ``setup`` (once per worker) calls ``load_encoder`` and opens the clip dataset; each batch is padded
    to ``batch_size`` with its last clip, encoded, and the pads dropped.
    """

    def __init__(self, dataset_dir: str, text_field: str, batch_size: int, dtype: str, load_encoder: LoadEncoder,
                 writer: shards.PartWriter):
        self.dataset_dir, self.text_field = dataset_dir, text_field
        self.batch_size, self.dtype, self.load_encoder, self.writer = int(batch_size), dtype, load_encoder, writer

    def setup(self):
        self._encode, self._tokenize = self.load_encoder()
        self._sources: dict[str, loader.ClipSource] = {}

    def process(self, job: tuple[str, int, int]) -> Iterator[str]:
        split, start, stop = job
        if split not in self._sources:
            self._sources[split] = loader.ClipSource(self.dataset_dir, skip_fields=("frames",), split=split)
        part = self.writer.path(split, f"{start:010d}")
        n = self.writer.write(part, self._examples(self._sources[split], start, stop))
        yield json.dumps({"split": split, "start": start, "num": n, "shard": part})

    def _examples(self, source: loader.ClipSource, start: int, stop: int) -> Iterator[dict]:
        for lo, hi in index_ranges(stop - start, self.batch_size):
            recs = [source[start + i] for i in range(lo, hi)]
            recs += [recs[-1]] * (self.batch_size - len(recs))
            frames = np.stack([r["first_frame"] for r in recs])
            ids = self._tokenize([str(r[self.text_field]) for r in recs])
            f_v, f_md = self._encode(frames, ids)
            beam.metrics.Metrics.counter(beam_util.NAMESPACE, "batches_encoded").inc()
            beam.metrics.Metrics.counter(beam_util.NAMESPACE, "clips_encoded").inc(hi - lo)
            for k in range(hi - lo):
                yield {"index": np.int32(start + lo + k), "f_v": np.asarray(f_v[k], self.dtype),
                       "f_md": np.asarray(f_md[k], self.dtype)}


def index_ranges(num_clips: int, size: int) -> list[tuple[int, int]]:
    """[(0, size), (size, 2 size), ..., (k size, num_clips)]: consecutive ranges covering ``num_clips`` records."""
    return [(s, min(s + size, num_clips)) for s in range(0, num_clips, size)]


class AnimegamerClipFeatures(tfds.core.GeneratorBasedBuilder):
    """The feature dataset (module docstring). Build it with :meth:`download_and_prepare`; read it with
    ``data/datasets.py`` / ``data/loader.py``, which need no instance of this class.

    Args:
      dataset_dir: the clip dataset (``datasets.find``); every split of its metadata gets features.
      load_encoder: picklable factory of the encoder and tokenizer, called once per worker.
      text_field: record field holding the text T5 encodes (``action``).
      batch_size: clips per encoder call (a multiple of each worker's local device count).
      run_meta: the run's identity stored in metadata.json (config sections, weights).
      config: a :class:`FeaturesConfig` (:func:`features_config`); data_dir etc. as tfds builders take.
    """

    VERSION = tfds.core.Version("2.0.0")
    RELEASE_NOTES = {
        "2.0.0": "First tfds dataset (Beam builder, ArrayRecord): replaces extract_features' f_v.npy / "
                 "f_md.npy / done.npy memory maps and meta.json (format animegamer_jax.features/1).",
    }

    def __init__(self, *, dataset_dir: str = "", load_encoder: LoadEncoder | None = None, text_field: str = "action",
                 batch_size: int = 8, run_meta: dict | None = None, **kwargs):
        self.dataset_dir, self.load_encoder, self.text_field = dataset_dir, load_encoder, text_field
        self.batch_size, self.run_meta = int(batch_size), dict(run_meta or {})
        super().__init__(**kwargs)

    @classmethod
    def get_metadata(cls):
        """The package's README.md describes the clip dataset: this dataset has its own description."""
        return dataclasses.replace(super().get_metadata(), description=DESCRIPTION)

    def _info(self) -> tfds.core.DatasetInfo:
        c = self.builder_config
        dtype = np.dtype(c.dtype)
        return self.dataset_info_from_configs(
            features=tfds.features.FeaturesDict({
                "index": tfds.features.Scalar(dtype=np.int32),
                "f_v": tfds.features.Tensor(shape=(c.num_patches, c.vision_width), dtype=dtype),
                "f_md": tfds.features.Tensor(shape=(c.text_length, c.text_dim), dtype=dtype),
            }),
            disable_shuffling=True,
            metadata=tfds.core.MetadataDict(),
            homepage="https://github.com/TencentARC/AnimeGamer",
        )

    def _splits(self) -> dict[str, dict]:
        """split -> read_index of the clip dataset, for every split its metadata lists."""
        return {s: datasets.read_index(self.dataset_dir, s) for s in datasets.metadata(self.dataset_dir)["splits"]}

    def _split_generators(self, dl_manager):  # _download_and_prepare writes the shards itself
        raise NotImplementedError

    def _generate_examples(self, *args, **kwargs):
        raise NotImplementedError

    def _download_and_prepare(self, dl_manager, download_config) -> None:
        """Runs the Beam pipeline (one :class:`EncodeClips` element per shard), names the shards in record
        order, sets the splits (same clip counts as the clip dataset's) and fills metadata.json."""
        del dl_manager
        c = self.builder_config
        writer = shards.PartWriter(self.info.features, self.info.file_format, self.data_dir)
        splits = self._splits()
        jobs = [(split, lo, hi) for split, index in splits.items()
                for lo, hi in index_ranges(index["num_clips"], self.batch_size * SHARD_BATCHES)]
        lines, counters = shards.run(jobs, EncodeClips(self.dataset_dir, self.text_field, self.batch_size, c.dtype,
                                                       self.load_encoder, writer),
                                     download_config.beam_options, os.path.join(os.fspath(self.data_dir), "shards-report.jsonl"))
        self.info.set_splits(tfds.core.SplitDict([
            shards.assemble(self, split, [(r["shard"], r["num"]) for r in sorted(
                (r for r in lines if r["split"] == split), key=lambda r: r["start"])])
            for split in splits]))
        meta = self.info.metadata
        meta.update({
            "format": FORMAT, "dataset": str(datasets.find(self.dataset_dir)), "text_field": self.text_field,
            "batch_size": self.batch_size,
            "shapes": {"f_v": [c.num_patches, c.vision_width], "f_md": [c.text_length, c.text_dim]},
            "dtype": c.dtype,
            "splits": {split: {"num_clips": index["num_clips"], "fingerprint": datasets.dataset_fingerprint(index)}
                       for split, index in splits.items()},
            **self.run_meta,
            "counters": counters,
        })
