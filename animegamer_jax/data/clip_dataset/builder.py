"""The clip dataset: a tensorflow-datasets builder whose examples are made by an Apache Beam pipeline.

Per film (one Beam element, :class:`FilmToClips`): decode, scene cuts and the 2 s clip plan
(``clips.plan_film``), the labels join (``label_schema.match_labels``), pass 2 decoding the clips
(``clips.extract_clips``, streaming: about one clip's frames in memory) and the motion scope / level
(``motion.py``). tfds serialises the examples and writes ArrayRecord shards; with
``disable_shuffling`` the records are sorted by the key ``film_rank * KEY_STRIDE + clip_index``, so
a film's clips are consecutive records in timestamp order, films in the order given.

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

Each film reports to a side output written as JSON lines into the dataset's incomplete folder, read
back and removed in :meth:`AnimegamerClips._process_pipeline_result` before tfds writes metadata.json
and renames the folder: nothing is visible at the final path until everything is.
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
from etils import epath

from animegamer_jax.data import beam_util
from animegamer_jax.data import clips as clips_lib
from animegamer_jax.data import label_schema, motion, video

NAME = "animegamer_clips"
#: record key = film_rank * KEY_STRIDE + clip_index (keys sort films in the given order, clips in time order)
KEY_STRIDE = 1_000_000
#: Beam counter namespace of every counter the pipeline keeps
COUNTER_NAMESPACE = beam_util.NAMESPACE
#: metadata.json["format"]: what data/datasets.py accepts
FORMAT = "animegamer_jax.clips/2"
#: data-config keys that define the clips (stored in the BuilderConfig and metadata.json)
CONFIG_KEYS = ("height", "width", "num_frames", "fps", "clip_seconds", "clip_stride_seconds", "scene_threshold",
               "flow_threshold", "motion_bins")
_REPORT = "report"


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


class FilmToClips(beam.DoFn):
    """(film_rank, film_id, path) -> (key, example) per clip; one JSON report line per film on ``report``.

    The labels file is read once per worker (``setup``). Every failure of a film (video.VideoError,
    clips.FilmTooShortError, label_schema.LabelError) is caught: counter ``films_failed`` +1 and a
    ``skipped`` report; the film yields no example.
    """

    def __init__(self, labels_path: str, config: dict):
        self.labels_path, self.config = labels_path, dict(config)

    def setup(self):
        self._labels = label_schema.read_labels(self.labels_path)
        self._cfg = _Cfg(self.config)

    def process(self, film: tuple[int, str, str]) -> Iterator:
        rank, film_id, path = film
        counter = lambda name: beam.metrics.Metrics.counter(COUNTER_NAMESPACE, name)  # noqa: E731
        try:
            specs, scenes, info = clips_lib.plan_film(path, film_id, self._cfg)
            film_labels = label_schema.match_labels(film_id, specs, self._labels, path)
        except (video.VideoError, clips_lib.FilmTooShortError, label_schema.LabelError, OSError) as e:
            counter("films_failed").inc()
            logging.warning("skip film %s (%s): %s", film_id, path, e)
            yield beam.pvalue.TaggedOutput(_REPORT, json.dumps(
                {"kind": "skipped", "film_id": film_id, "path": path, "reason": str(e)}))
            return
        unlabelled = [s for s, lab in zip(specs, film_labels) if lab is None]
        for s in unlabelled:
            yield beam.pvalue.TaggedOutput(_REPORT, json.dumps(
                {"kind": "unlabelled", "film_id": film_id, "clip_index": s.clip_index,
                 "reason": self._labels.unlabelled[(film_id, s.clip_index)][1]}))
        counter("clips_unlabelled").inc(len(unlabelled))
        kept = [(s, lab) for s, lab in zip(specs, film_labels) if lab is not None]
        labels_by_index = {s.clip_index: lab for s, lab in kept}
        bins = tuple(float(b) for b in self.config["motion_bins"])
        rows = []
        try:
            for clip in clips_lib.extract_clips(path, [s for s, _ in kept], int(self.config["height"]),
                                                int(self.config["width"])):
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
                counter("clips_written").inc()
                yield rank * KEY_STRIDE + spec.clip_index, example
        except video.VideoError as e:  # the stream ended early: the clips yielded so far stay in
            counter("films_failed").inc()
            logging.warning("film %s (%s) ended early: %s", film_id, path, e)
            yield beam.pvalue.TaggedOutput(_REPORT, json.dumps(
                {"kind": "skipped", "film_id": film_id, "path": path,
                 "reason": f"{e} (its first {len(rows)} clip(s) are in the dataset)"}))
        else:
            counter("films_done").inc()
        yield beam.pvalue.TaggedOutput(_REPORT, json.dumps(
            {"kind": "film", "film_id": film_id, "rank": rank, "path": path, "num_frames": info.num_frames,
             "fps": info.fps, "num_scenes": len(scenes), "num_clips": len(rows), "clips": rows}))


class _Cfg(dict):
    """A dict that answers ``cfg.key`` and ``cfg.get`` like the ml_collections section clips.plan_film reads."""

    __getattr__ = dict.__getitem__


class _SplitExamples(beam.PTransform):
    """Films of one split -> (key, example); the film reports go to ``report_path`` (one JSON line each)."""

    def __init__(self, films: Sequence[tuple[int, str, str]], labels_path: str, config: dict, report_path: str):
        super().__init__()
        self.films, self.labels_path, self.config, self.report_path = list(films), labels_path, config, report_path

    def expand(self, root):
        out = (root | "Films" >> beam.Create(self.films)
               | "Reshuffle" >> beam.Reshuffle()  # one film per worker, not one worker for all
               | "FilmToClips" >> beam.ParDo(FilmToClips(self.labels_path, self.config)).with_outputs(
                   _REPORT, main="examples"))
        _ = out[_REPORT] | "WriteReport" >> beam.io.WriteToText(self.report_path, num_shards=1,
                                                                 shard_name_template="")
        return out["examples"]


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

    def _split_generators(self, dl_manager):
        del dl_manager
        config = self.builder_config.data_values()
        return {name: _SplitExamples(films, self.labels_path, config, self._report_path(name))
                for name, films in self._split_films().items()}

    def _generate_examples(self, *args, **kwargs):  # _split_generators makes the PTransforms
        raise NotImplementedError

    def _report_path(self, split: str) -> str:
        return os.fspath(epath.Path(self.data_dir) / f"report-{split}.jsonl")

    def _process_pipeline_result(self, pipeline_result) -> None:
        """Film reports and counters -> metadata.json (the report files are removed)."""
        meta = self.info.metadata
        meta.update({"format": FORMAT, "config": self.builder_config.data_values(), "labels": self.labels_path,
                     "films": [], "skipped": [], "unlabelled": [], "splits": {}})
        for split, films in self._split_films().items():
            report = epath.Path(self._report_path(split))
            lines = [json.loads(s) for s in report.read_text().splitlines() if s.strip()]
            report.unlink()
            done = sorted((r for r in lines if r["kind"] == "film"), key=lambda r: r["rank"])
            rows = [row for r in done for row in r.pop("clips")]
            for i, row in enumerate(rows):
                row["index"] = i
            meta["splits"][split] = {"num_clips": len(rows), "clips": rows}
            meta["films"] += [{**{k: v for k, v in r.items() if k not in ("kind", "rank")}, "split": split}
                              for r in done]
            order = {f[1]: f[0] for f in films}
            meta["skipped"] += [{k: r[k] for k in ("film_id", "path", "reason")}
                                for r in sorted((r for r in lines if r["kind"] == "skipped"),
                                                key=lambda r: order[r["film_id"]])]
            meta["unlabelled"] += sorted(({k: r[k] for k in ("film_id", "clip_index", "reason")}
                                          for r in lines if r["kind"] == "unlabelled"),
                                         key=lambda r: (order[r["film_id"]], r["clip_index"]))
        meta["counters"] = beam_util.counters(pipeline_result, COUNTER_NAMESPACE)
