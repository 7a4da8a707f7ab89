"""The feature dataset: the shot encoder's frozen inputs per clip of a clip dataset, as a tfds Beam builder.

Built by ``python -m animegamer_jax.data.extract_features``, which supplies the models; read by
``data/loader.py`` (``ClipSource(dataset, features_dir=...)``) through ``tfds.builder_from_directory``.
One record per clip of the clip dataset, in the same splits and the same order (key = the clip's
record index in its split, ``disable_shuffling``), so record ``i`` of a split holds clip ``i``'s features:

  index  int32 []          the clip's record index in the clip dataset's split (the loader checks it)
  f_v    float [P, Dv]     CLIP penultimate patch tokens of the clip's first frame (docs/encoders.md)
  f_md   float [Lt, Dt]    T5 encoder output of the clip's action text (docs/encoders.md)

float is float32 or float16 (the BuilderConfig, named from the sizes: ``"196x768-30x4096-float32"``).
metadata.json: format, the clip dataset's path, per split its clip count and fingerprint
(``datasets.dataset_fingerprint``), text_field, the run's config sections and weights, and the
pipeline's counters (``animegamer/clips_encoded``, ``animegamer/batches_encoded``).

Pipeline per split: the split's record indices cut into fixed ranges of ``batch_size`` up front ->
``Reshuffle`` (ranges spread over workers) -> :class:`EncodeClips`. Fixed ranges rather than
``beam.BatchElements``: BatchElements batches within a bundle, so bundle ends give short batches of
any size (one XLA compile per size); fixed ranges give full batches and one short last batch per
split, padded to ``batch_size`` so the jitted program compiles once per worker; a range is also a
run of consecutive records, read in order from the ArrayRecord shards.

The models are not imported here: :class:`EncodeClips` calls a ``load_encoder`` factory (picklable,
``extract_features.ModelLoader``) once per worker, so this module knows the dataset, not the networks.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from typing import Protocol

import apache_beam as beam
import numpy as np
import tensorflow_datasets as tfds

from animegamer_jax.data import beam_util, datasets, loader

NAME = "animegamer_clip_features"
#: metadata.json["format"] of a feature dataset
FORMAT = "animegamer_jax.features/2"
#: the record fields besides ``index``
FIELDS = ("f_v", "f_md")
DTYPES = ("float32", "float16")
DESCRIPTION = ("Per clip of an AnimeGamer clip dataset (animegamer_clips), the shot encoder's frozen inputs: "
               "f_v, the CLIP ViT penultimate patch tokens of the clip's first frame, and f_md, the T5 encoder "
               "output of its action text. Record i of a split belongs to record i of the same split of the clip "
               "dataset named in metadata.json. Built by `python -m animegamer_jax.data.extract_features`.")


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


class EncodeClips(beam.DoFn):
    """(start, stop) record range of a split -> (index, example) per clip of it.

    ``setup`` (once per worker) calls ``load_encoder`` and opens the clip dataset; ``process`` reads the
    range's records, pads the batch to ``batch_size`` with its last clip, encodes, and drops the pads.
    """

    def __init__(self, dataset_dir: str, split: str, text_field: str, batch_size: int, dtype: str,
                 load_encoder: LoadEncoder):
        self.dataset_dir, self.split, self.text_field = dataset_dir, split, text_field
        self.batch_size, self.dtype, self.load_encoder = int(batch_size), dtype, load_encoder

    def setup(self):
        self._encode, self._tokenize = self.load_encoder()
        self._source = loader.ClipSource(self.dataset_dir, skip_fields=("frames",), split=self.split)

    def process(self, index_range: tuple[int, int]) -> Iterator[tuple[int, dict]]:
        start, stop = index_range
        recs = [self._source[i] for i in range(start, stop)]
        recs += [recs[-1]] * (self.batch_size - len(recs))
        frames = np.stack([r["first_frame"] for r in recs])
        ids = self._tokenize([str(r[self.text_field]) for r in recs])
        f_v, f_md = self._encode(frames, ids)
        beam.metrics.Metrics.counter(beam_util.NAMESPACE, "batches_encoded").inc()
        beam.metrics.Metrics.counter(beam_util.NAMESPACE, "clips_encoded").inc(stop - start)
        for k, i in enumerate(range(start, stop)):
            yield i, {"index": np.int32(i), "f_v": np.asarray(f_v[k], self.dtype),
                      "f_md": np.asarray(f_md[k], self.dtype)}


class _EncodeSplit(beam.PTransform):
    """Fixed index ranges of one split -> (index, example) (module docstring: why fixed ranges)."""

    def __init__(self, ranges: Sequence[tuple[int, int]], encode: EncodeClips):
        super().__init__()
        self.ranges, self.encode = list(ranges), encode

    def expand(self, root):
        return (root | "Ranges" >> beam.Create(self.ranges)
                | "Reshuffle" >> beam.Reshuffle()  # ranges spread over the workers, not all on one
                | "EncodeClips" >> beam.ParDo(self.encode))


def index_ranges(num_clips: int, batch_size: int) -> list[tuple[int, int]]:
    """[(0, b), (b, 2b), ..., (kb, num_clips)]: the batches of a split of ``num_clips`` records."""
    return [(s, min(s + batch_size, num_clips)) for s in range(0, num_clips, batch_size)]


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

    def _split_generators(self, dl_manager):
        del dl_manager
        c = self.builder_config
        return {split: _EncodeSplit(index_ranges(index["num_clips"], self.batch_size),
                                    EncodeClips(self.dataset_dir, split, self.text_field, self.batch_size, c.dtype,
                                                self.load_encoder))
                for split, index in self._splits().items()}

    def _generate_examples(self, *args, **kwargs):  # _split_generators makes the PTransforms
        raise NotImplementedError

    def _process_pipeline_result(self, pipeline_result) -> None:
        """The clip dataset's identity, the run's identity and the counters -> metadata.json."""
        c = self.builder_config
        meta = self.info.metadata
        meta.update({
            "format": FORMAT, "dataset": str(datasets.find(self.dataset_dir)), "text_field": self.text_field,
            "batch_size": self.batch_size,
            "shapes": {"f_v": [c.num_patches, c.vision_width], "f_md": [c.text_length, c.text_dim]},
            "dtype": c.dtype,
            "splits": {split: {"num_clips": index["num_clips"], "fingerprint": datasets.dataset_fingerprint(index)}
                       for split, index in self._splits().items()},
            **self.run_meta,
        })
        meta["counters"] = beam_util.counters(pipeline_result)

