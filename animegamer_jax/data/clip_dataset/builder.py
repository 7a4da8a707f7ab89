"""The clip dataset: a tensorflow-datasets builder whose shards are written by an Apache Beam pipeline.

Per film (one Beam element, :class:`FilmToShard`): decode, scene cuts and the 2 s clip plan
(``clips.plan_film``), the labels join (``label_schema.match_labels``), pass 2 decoding the clips
(``clips.extract_clips``) and the motion scope / level (``motion.py``); each clip is appended to the
film's own ArrayRecord shard as it is decoded (``shards.py``: about one clip's frames in memory
whatever the film's length, nothing shuffled through the runner). Shard k of a split is the k-th
film of the split that yielded clips, records in clip order: a film's clips are consecutive records
in timestamp order, films in the order given.

Example features (``_info``):
  frames       uint8 [T, H, W, 3]  RGB clip frames (frames[0] is the shot encoder's reference)
  frame_times  float32 [T]         seconds from film start of each frame
  states       int32 [4]           [ML, SC, ET, ST] (motion level 1..5; state changes -5..5)
  motion_scope float32 []          data/motion.py; motion_level int32 [] (1..5)
  film_id, action, background, instruction  text; characters  sequence of text
  scene_id, clip_index int32 []; start_time, end_time float32 [] (s)

Splits by film: films named in ``heldout_films`` form the ``heldout`` split, the others ``train``.
Sizes come from the ``data`` config section through :class:`ClipsConfig`.

Bad input fails its own film only: an unreadable / corrupt / too-short film, or labels that do not
match it, is counted (Beam counter ``animegamer/films_failed``), logged, and listed with the reason
in the dataset's metadata.json (``skipped``); the other films are built. Clips marked ``unlabelled``
are left out and listed (``unlabelled``). metadata.json also holds the config, the films, one row per
clip (no pixels) per split and the pipeline's counters (``data/datasets.py`` reads it).

Each film reports JSON lines (film, skipped, unlabelled clips; written by the pipeline into the dataset's incomplete folder, read
back and removed by :meth:`AnimegamerClips._download_and_prepare`, which also names the shards and
sets the splits); tfds then writes metadata.json and renames the folder: nothing is visible at the
final path until everything is.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Iterator, Sequence

import apache_beam as beam
import numpy as np
import tensorflow_datasets as tfds

from animegamer_jax.data import beam_util
from animegamer_jax.data import clips as clips_lib
from animegamer_jax.data import datasets, label_schema, motion, video
from animegamer_jax.data.clip_dataset import shards

NAME = "animegamer_clips"
#: Beam counter namespace of every counter the pipeline keeps
COUNTER_NAMESPACE = beam_util.NAMESPACE
#: metadata.json["format"]: what data/datasets.py accepts
FORMAT = datasets.CLIP_FORMAT
#: data-config keys that define the clips (stored in the BuilderConfig and metadata.json)
CONFIG_KEYS = ("height", "width", "num_frames", "fps", "clip_seconds", "clip_stride_seconds", "scene_threshold",
               "flow_threshold", "motion_bins")


@dataclasses.dataclass(eq=False)
class ClipsConfig(tfds.core.BuilderConfig):
    """Sizes of the clips (the ``data`` config section); ``name`` is derived by :func:`config_from_data`."""

    height: int = 64
    width: int = 96
    num_frames: int = 17
    fps: float = 8.0
    clip_seconds: float = 2.0
    clip_stride_seconds: float = 0.0
    scene_threshold: float = 27.0
    flow_threshold: float = 0.2
    motion_bins: tuple[float, ...] = (1.118, 5.0, 12.247, 24.495)

    def data_values(self) -> dict:
        """The CONFIG_KEYS as JSON values (motion_bins a list)."""
        return {k: (list(getattr(self, k)) if k == "motion_bins" else getattr(self, k)) for k in CONFIG_KEYS}


def config_from_data(data_cfg) -> ClipsConfig:
    """ClipsConfig of a ``data`` config section; the name says the clip size, e.g. ``"64x96x17"``."""
    values = {k: data_cfg.get(k, 0.0) if k == "clip_stride_seconds" else data_cfg[k] for k in CONFIG_KEYS}
    values = {k: (tuple(float(b) for b in v) if k == "motion_bins" else
                  int(v) if k in ("height", "width", "num_frames") else float(v)) for k, v in values.items()}
    name = f"{values['height']}x{values['width']}x{values['num_frames']}"
    return ClipsConfig(name=name, description=f"{name} clips: {json.dumps(values)}", **values)


class FilmToShard(beam.DoFn):
    """(split, film_rank, film_id, path) -> JSON report lines; writes the film's clips to its part file
    (shards.PartWriter; named by the builder afterwards).

    The labels file is read once per worker (``setup``). A film that fails before its first clip
    (video.VideoError, clips.FilmTooShortError, label_schema.LabelError) writes no shard: counter
    ``films_failed`` +1 and a ``skipped`` report. A stream that ends early keeps the clips written so
    far (the shard is closed normally) and is reported ``skipped`` too, with the count kept.
    """

    def __init__(self, labels_path: str, config: dict, writer: shards.PartWriter):
        self.labels_path, self.config, self.writer = labels_path, dict(config), writer

    def setup(self):
        self._labels = label_schema.read_labels(self.labels_path)
        self._cfg = _Cfg(self.config)

    def process(self, film: tuple[str, int, str, str]) -> Iterator[str]:
        split, rank, film_id, path = film
        counter = lambda name: beam.metrics.Metrics.counter(COUNTER_NAMESPACE, name)  # noqa: E731
        try:
            specs, scenes, info = clips_lib.plan_film(path, film_id, self._cfg)
            film_labels = label_schema.match_labels(film_id, specs, self._labels, path)
        except (video.VideoError, clips_lib.FilmTooShortError, label_schema.LabelError, OSError) as e:
            counter("films_failed").inc()
            logging.warning("skip film %s (%s): %s", film_id, path, e)
            yield json.dumps({"kind": "skipped", "split": split, "rank": rank, "film_id": film_id, "path": path,
                              "reason": str(e)})
            return
        for s in [s for s, lab in zip(specs, film_labels) if lab is None]:
            yield json.dumps({"kind": "unlabelled", "split": split, "rank": rank, "film_id": film_id,
                              "clip_index": s.clip_index,
                              "reason": self._labels.unlabelled[(film_id, s.clip_index)][1]})
            counter("clips_unlabelled").inc()
        kept = [(s, lab) for s, lab in zip(specs, film_labels) if lab is not None]
        rows: list[dict] = []
        ended: list[str] = []
        shard = self.writer.path(split, f"film{rank:05d}")
        if kept:
            self.writer.write(shard, self._examples(film_id, path, kept, rows, ended))
        if ended:  # the stream ended early: the clips written so far stay in
            counter("films_failed").inc()
            logging.warning("film %s (%s) ended early: %s", film_id, path, ended[0])
            yield json.dumps({"kind": "skipped", "split": split, "rank": rank, "film_id": film_id, "path": path,
                              "reason": f"{ended[0]} (its first {len(rows)} clip(s) are in the dataset)"})
        else:
            counter("films_done").inc()
        yield json.dumps({"kind": "film", "split": split, "rank": rank, "film_id": film_id, "path": path,
                          "num_frames": info.num_frames, "fps": info.fps, "num_scenes": len(scenes),
                          "num_clips": len(rows), "shard": shard if rows else "", "clips": rows})

    def _examples(self, film_id: str, path: str, kept: list, rows: list[dict], ended: list[str]) -> Iterator[dict]:
        """The film's examples, decoded one clip at a time; appends each clip's row to ``rows``; a
        VideoError mid-stream ends the iteration (the shard keeps what came before) and lands in ``ended``."""
        labels_by_index = {s.clip_index: lab for s, lab in kept}
        bins = tuple(float(b) for b in self.config["motion_bins"])
        clips = clips_lib.extract_clips(path, [s for s, _ in kept], int(self.config["height"]),
                                        int(self.config["width"]))
        while True:
            try:
                clip = next(clips)
            except StopIteration:
                return
            except video.VideoError as e:
                ended.append(str(e))
                return
            spec, label = clip.spec, labels_by_index[clip.spec.clip_index]
            scope = motion.motion_scope(clip.frames, r=float(self.config["flow_threshold"]))
            level = motion.motion_level(scope, bins)
            states = np.array([level, *label.state_changes()], np.int32)
            example = {"frames": clip.frames, "frame_times": spec.frame_times, "states": states,
                       "motion_scope": np.float32(scope), "motion_level": np.int32(level),
                       "film_id": film_id, "scene_id": np.int32(spec.scene_id),
                       "clip_index": np.int32(spec.clip_index), "start_time": np.float32(spec.start_time),
                       "end_time": np.float32(spec.end_time), "characters": list(label.characters),
                       "action": label.action, "background": label.background,
                       "instruction": label.instruction}
            rows.append({"film_id": film_id, "scene_id": spec.scene_id, "clip_index": spec.clip_index,
                         "start_time": spec.start_time, "end_time": spec.end_time, "motion_level": level,
                         "instruction": label.instruction, "motion_scope": scope, "states": states.tolist()})
            beam.metrics.Metrics.counter(COUNTER_NAMESPACE, "clips_written").inc()
            yield example


class _Cfg(dict):
    """A dict that answers ``cfg.key`` and ``cfg.get`` like the ml_collections section clips.plan_film reads."""

    __getattr__ = dict.__getitem__


class AnimegamerClips(tfds.core.GeneratorBasedBuilder):
    """The clip dataset (module docstring). Build it with :meth:`download_and_prepare`; read it with
    ``data/datasets.py`` (``tfds.builder_from_directory``), which needs no instance of this class.

    Args:
      films: (film_id, path) in record order; ids unique.
      labels_path: labels JSONL (label_schema.py).
      heldout_films: film ids of the ``heldout`` split.
      config: a :class:`ClipsConfig` (:func:`config_from_data`); data_dir etc. as tfds builders take.
    """

    VERSION = tfds.core.Version("2.0.0")
    RELEASE_NOTES = {
        "2.0.0": "First tfds dataset (Beam builder, ArrayRecord): replaces the home-made ArrayRecord shards + "
                 "dataset.json (format animegamer_jax.clips/1); first_frame is frames[0], not stored twice.",
    }

    def __init__(self, *, films: Sequence[tuple[str, str]] = (), labels_path: str = "",
                 heldout_films: Sequence[str] = (), **kwargs):
        self.films, self.labels_path, self.heldout_films = list(films), labels_path, tuple(heldout_films)
        super().__init__(**kwargs)

    def _info(self) -> tfds.core.DatasetInfo:
        c = self.builder_config
        t, h, w = c.num_frames, c.height, c.width
        scalar = tfds.features.Scalar
        return self.dataset_info_from_configs(
            features=tfds.features.FeaturesDict({
                "frames": tfds.features.Tensor(shape=(t, h, w, 3), dtype=np.uint8),
                "frame_times": tfds.features.Tensor(shape=(t,), dtype=np.float32),
                "states": tfds.features.Tensor(shape=(4,), dtype=np.int32),
                "motion_scope": scalar(dtype=np.float32), "motion_level": scalar(dtype=np.int32),
                "film_id": tfds.features.Text(), "scene_id": scalar(dtype=np.int32),
                "clip_index": scalar(dtype=np.int32), "start_time": scalar(dtype=np.float32),
                "end_time": scalar(dtype=np.float32), "characters": tfds.features.Sequence(tfds.features.Text()),
                "action": tfds.features.Text(), "background": tfds.features.Text(),
                "instruction": tfds.features.Text(),
            }),
            disable_shuffling=True,
            metadata=tfds.core.MetadataDict(),
            homepage="https://github.com/TencentARC/AnimeGamer",
        )

    def _split_films(self) -> dict[str, list[tuple[int, str, str]]]:
        ranked = [(rank, film_id, path) for rank, (film_id, path) in enumerate(self.films)]
        splits = {"train": [f for f in ranked if f[1] not in self.heldout_films],
                  "heldout": [f for f in ranked if f[1] in self.heldout_films]}
        return {name: films for name, films in splits.items() if films}

    def _split_generators(self, dl_manager):  # _download_and_prepare writes the shards itself
        raise NotImplementedError

    def _generate_examples(self, *args, **kwargs):
        raise NotImplementedError

    def _download_and_prepare(self, dl_manager, download_config) -> None:
        """Runs the Beam pipeline (one :class:`FilmToShard` element per film), names the shards of each split
        ``<name>-<split>.array_record-0000k-of-0000N`` in film order, sets the splits and fills
        metadata.json (film reports, Beam counters).

        A split that ends with no clip is left out (its films listed in skipped / unlabelled).

        Raises:
          NoClipsError: no split has a clip (every film failed, or every clip is unlabelled).
        """
        del dl_manager
        writer = shards.PartWriter(self.info.features, self.info.file_format, self.data_dir)
        jobs = [(split, rank, film_id, path) for split, films in self._split_films().items()
                for rank, film_id, path in films]
        lines, counters = shards.run(jobs, FilmToShard(self.labels_path, self.builder_config.data_values(), writer),
                                     download_config.beam_options, os.path.join(os.fspath(self.data_dir), "films-report.jsonl"))
        meta = self.info.metadata
        meta.update({"format": FORMAT, "config": self.builder_config.data_values(), "labels": self.labels_path,
                     "films": [], "skipped": [], "unlabelled": [], "splits": {}})
        split_infos = []
        for split in self._split_films():
            mine = sorted((r for r in lines if r["split"] == split), key=lambda r: (r["rank"], r.get("clip_index", -1)))
            done = [r for r in mine if r["kind"] == "film"]
            written = [r for r in done if r["num_clips"]]
            if not written:  # listed in skipped / unlabelled; the other splits are built
                logging.warning("split %s has no clip: every film failed or every clip is unlabelled", split)
                meta["skipped"] += [{k: r[k] for k in ("film_id", "path", "reason")} for r in mine
                                    if r["kind"] == "skipped"]
                meta["unlabelled"] += [{k: r[k] for k in ("film_id", "clip_index", "reason")}
                                       for r in mine if r["kind"] == "unlabelled"]
                continue
            split_infos.append(shards.assemble(self, split, [(r["shard"], r["num_clips"]) for r in written]))
            rows = [row for r in done for row in r.pop("clips")]
            for i, row in enumerate(rows):
                row["index"] = i
            meta["splits"][split] = {"num_clips": len(rows), "clips": rows}
            meta["films"] += [{**{k: v for k, v in r.items() if k not in ("kind", "rank", "shard")}, "split": split}
                              for r in done]
            meta["skipped"] += [{k: r[k] for k in ("film_id", "path", "reason")} for r in mine if r["kind"] == "skipped"]
            meta["unlabelled"] += [{k: r[k] for k in ("film_id", "clip_index", "reason")}
                                   for r in mine if r["kind"] == "unlabelled"]
        if not split_infos:
            raise NoClipsError(f"no clips to write: every film failed or every clip is marked unlabelled "
                               f"({[r['reason'] for r in lines if r['kind'] == 'skipped']})")
        meta["counters"] = counters
        self.info.set_splits(tfds.core.SplitDict(split_infos))


class NoClipsError(ValueError):
    """A split of the clip dataset would hold no clip."""
