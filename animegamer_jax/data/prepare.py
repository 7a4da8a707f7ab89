r"""Films + labels -> clip dataset (ArrayRecord shards + dataset.json; see storage.py).

  python -m animegamer_jax.data.prepare --config=configs/tiny.py \
      --film=sample_film=data/prepared/sample_film.mp4 [--film_dir=DIR] --labels=data/sample_labels.jsonl \
      --out=data/prepared/tiny [--num_shards=2] [--skip_bad] [--overwrite]

Steps (paper Sec. 3.3 / App. B): for every film, pass 1 decodes it, finds scene cuts and plans the
2 s clips, and matches them with the labels file; only when every film is planned and labelled does
pass 2 decode the clips, score their motion scope / level (motion.py) and write the records.

Atomic: everything is written into a hidden temporary directory beside `--out`, which is renamed to
`--out` only after the last shard and the index are closed; a crash or an error removes it, so no
half-written dataset or shard is ever visible at `--out`. An existing `--out` is replaced only with
`--overwrite`.

Clips marked `unlabelled` in the labels file (data/caption.py could not label them) are left out and
listed in the report and in dataset.json's "unlabelled".

Bad input: an unreadable / corrupt / empty video, a film shorter than one clip, labels that do not
match the clips, or unknown characters raise an error naming the file and clip; with `--skip_bad`
the film is left out instead and listed in the report (and in dataset.json's "skipped").
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence

import numpy as np
from absl import flags
from array_record.python.array_record_module import ArrayRecordWriter
from ml_collections import config_flags

from animegamer_jax import cli as cli_lib
from animegamer_jax import paths
from animegamer_jax.data import clips as clips_lib
from animegamer_jax.data import label_schema, motion, storage, video
from animegamer_jax.data.films import list_film_dir, parse_film_arg


@dataclasses.dataclass
class PrepareReport:
    """What prepare_dataset did: clips written, films skipped (film_id, path, reason), seconds spent."""

    out_dir: str
    num_clips: int
    films: list[str]
    skipped: list[tuple[str, str, str]]
    motion_scopes: list[float]
    seconds: float
    unlabelled: list[tuple[str, int, str]] = dataclasses.field(default_factory=list)

    def summary(self) -> str:
        lines = [f"wrote {self.num_clips} clips of {len(self.films)} film(s) to {self.out_dir} "
                 f"in {self.seconds:.1f} s"]
        for film_id, path, reason in self.skipped:
            lines.append(f"skipped film '{film_id}' ({path}): {reason}")
        if self.unlabelled:
            lines.append(f"left out {len(self.unlabelled)} clip(s) marked unlabelled in the labels file "
                         f"(label them by hand to include them): "
                         f"{[f'{f}:{i}' for f, i, _ in self.unlabelled]}")
        if self.motion_scopes:
            lines.append(f"motion scopes: {[round(s, 3) for s in self.motion_scopes]}")
            if len(self.motion_scopes) >= 5:
                lines.append(f"equal-count motion bins for config.data.motion_bins: "
                             f"{motion.derive_bins(self.motion_scopes)}")
        return "\n".join(lines)


_CONFIG_KEYS = ("height", "width", "num_frames", "fps", "clip_seconds", "scene_threshold",
                "flow_threshold", "motion_bins")


def prepare_dataset(films: Sequence[tuple[str, str]], labels_path: str, out_dir: str, data_cfg,
                    num_shards: int = 1, skip_bad: bool = False, overwrite: bool = False,
                    feature_fn: Callable[[clips_lib.Clip], dict[str, np.ndarray]] | None = None,
                    log: Callable[[str], None] = lambda s: None) -> PrepareReport:
    """Builds a clip dataset from films and a labels file.

    Args:
      films: (film_id, video path) pairs; ids must be unique.
      labels_path: labels JSONL (label_schema.py format).
      out_dir: dataset directory to create.
      data_cfg: the `data` config section (height, width, num_frames, fps, clip_seconds,
        scene_threshold, flow_threshold, motion_bins).
      num_shards: ArrayRecord shards (clips are split into contiguous, near-equal ranges).
      skip_bad: leave out films that fail (reported) instead of raising.
      overwrite: replace an existing out_dir.
      feature_fn: optional, maps a decoded clip to extra arrays stored in its record (precomputed
        VAE latents, E_a features, ...).
      log: progress callback.

    Raises:
      FileExistsError: out_dir exists and not overwrite.
      video.VideoError, clips.FilmTooShortError, label_schema.LabelError: bad input (without skip_bad),
        naming file and clip.
      ValueError: no clip at all, duplicate film ids, num_shards < 1.
    """
    t0 = time.time()
    if paths.is_url(out_dir):
        raise ValueError(f"--out {out_dir}: ArrayRecord shards are written to local files (array_record has no "
                         f"URL support). Fix: write to a local folder or a gcsfuse mount of the bucket "
                         f"(`gcsfuse --implicit-dirs BUCKET /gcs/BUCKET`), e.g. /gcs/{out_dir.split('://', 1)[1]}")
    out_dir = os.path.abspath(out_dir)
    if os.path.exists(out_dir) and not overwrite:
        raise FileExistsError(f"{out_dir} exists; pass overwrite=True (--overwrite) to replace it")
    if num_shards < 1:
        raise ValueError(f"num_shards must be >= 1, got {num_shards}")
    ids = [f for f, _ in films]
    if len(set(ids)) != len(ids):
        raise ValueError(f"duplicate film ids in {ids}")
    labels = label_schema.read_labels(labels_path)

    # Pass 1: plan and label every film before writing anything.
    planned: list[tuple[str, str, list[clips_lib.ClipSpec], list[label_schema.ClipLabel]]] = []
    skipped: list[tuple[str, str, str]] = []
    unlabelled: list[tuple[str, int, str]] = []
    for film_id, path in films:
        try:
            specs, scenes, info = clips_lib.plan_film(path, film_id, data_cfg)
            film_labels = label_schema.match_labels(film_id, specs, labels, path)
        except (video.VideoError, clips_lib.FilmTooShortError, label_schema.LabelError) as e:
            if not skip_bad:
                raise
            skipped.append((film_id, path, str(e)))
            log(f"skip {film_id}: {e}")
            continue
        log(f"{film_id}: {info.num_frames} frames at {info.fps:g} fps, {len(scenes)} scenes, {len(specs)} clips")
        unlabelled += [(film_id, s.clip_index, labels.unlabelled[(film_id, s.clip_index)][1])
                       for s, lab in zip(specs, film_labels) if lab is None]
        kept = [(s, lab) for s, lab in zip(specs, film_labels) if lab is not None]
        if kept:
            planned.append((film_id, path, [s for s, _ in kept], [lab for _, lab in kept]))
    total = sum(len(p[2]) for p in planned)
    if total == 0:
        raise ValueError(f"no clips to write (films skipped: {[s[0] for s in skipped]}; "
                         f"clips marked unlabelled: {len(unlabelled)})")
    num_shards = min(num_shards, total)
    bounds = np.linspace(0, total, num_shards + 1).round().astype(int)

    parent = os.path.dirname(out_dir)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(out_dir)}.tmp-", dir=parent)
    try:
        rows, scopes, film_rows, feature_fields = [], [], [], set()
        shard, writer = -1, None
        bins = tuple(float(b) for b in data_cfg.motion_bins)
        g = 0
        for film_id, path, specs, film_labels in planned:
            film_rows.append({"film_id": film_id, "path": os.path.abspath(path), "first_index": g,
                              "num_clips": len(specs)})
            for clip, label in zip(clips_lib.extract_clips(path, specs, int(data_cfg.height), int(data_cfg.width)),
                                   film_labels, strict=True):
                while g >= bounds[shard + 1]:
                    if writer is not None:
                        writer.close()
                    shard += 1
                    writer = ArrayRecordWriter(os.path.join(tmp, storage.shard_name(shard, num_shards)),
                                               "group_size:1")
                scope = motion.motion_scope(clip.frames, r=float(data_cfg.flow_threshold))
                level = motion.motion_level(scope, bins)
                spec = clip.spec
                states = np.array([level, *label.state_changes()], np.int32)
                arrays = {"frames": clip.frames, "first_frame": clip.first_frame,
                          "frame_times": spec.frame_times, "states": states,
                          "motion_scope": np.float32(scope)}
                if feature_fn is not None:
                    extra = {k: np.asarray(v) for k, v in feature_fn(clip).items()}
                    clash = set(extra) & set(arrays)
                    if clash:
                        raise ValueError(f"feature_fn returned reserved field names {sorted(clash)}")
                    feature_fields.update(extra)
                    arrays.update(extra)
                values = {"film_id": film_id, "scene_id": spec.scene_id, "clip_index": spec.clip_index,
                          "start_time": spec.start_time, "end_time": spec.end_time, "motion_level": level,
                          "characters": list(label.characters), "action": label.action,
                          "background": label.background, "instruction": label.instruction}
                writer.write(storage.encode_record(arrays, values))
                rows.append({"index": g, **{k: values[k] for k in ("film_id", "scene_id", "clip_index",
                                                                    "start_time", "end_time", "motion_level",
                                                                    "instruction")},
                             "motion_scope": scope, "states": states.tolist()})
                scopes.append(scope)
                g += 1
            log(f"{film_id}: wrote {len(specs)} clips")
        if writer is not None:
            writer.close()
        index = {
            "format": storage.FORMAT,
            "config": {**{k: (list(data_cfg[k]) if k == "motion_bins" else data_cfg[k]) for k in _CONFIG_KEYS},
                       "clip_stride_seconds": float(data_cfg.get("clip_stride_seconds", 0.0))},
            "num_clips": g,
            "shards": [{"file": storage.shard_name(k, num_shards), "num_records": int(bounds[k + 1] - bounds[k])}
                       for k in range(num_shards)],
            "films": film_rows,
            "clips": rows,
            "feature_fields": sorted(feature_fields),
            "labels": os.path.abspath(labels_path),
            "skipped": [{"film_id": f, "path": p, "reason": r} for f, p, r in skipped],
            "unlabelled": [{"film_id": f, "clip_index": i, "reason": r} for f, i, r in unlabelled],
        }
        with open(os.path.join(tmp, storage.INDEX_FILE), "w", encoding="utf-8") as f:
            json.dump(index, f, indent=1)
        os.chmod(tmp, 0o755)
        if os.path.exists(out_dir):
            old = tempfile.mkdtemp(prefix=f".{os.path.basename(out_dir)}.old-", dir=parent)
            os.rename(out_dir, os.path.join(old, "d"))
            os.rename(tmp, out_dir)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return PrepareReport(out_dir, g, [p[0] for p in planned], skipped, scopes, time.time() - t0, unlabelled)


def define_flags(fv, argv: list[str]) -> None:
    """The flags of ``python -m animegamer_jax.data.prepare`` on ``fv`` (absl + ml_collections config_flags)."""
    config_flags.DEFINE_config_file("config", paths.resource("configs/tiny.py"), "Config file; its `data` section "
                                    "is used.", flag_values=fv, lock_config=False, sys_argv=argv)
    flags.DEFINE_multi_string("film", None, "FILM_ID=PATH (or PATH, id = file stem); repeat per film.",
                              flag_values=fv)
    flags.DEFINE_string("film_dir", "", "Folder of films (every video file in it; id = file stem).", flag_values=fv)
    flags.DEFINE_string("labels", paths.resource("data/sample_labels.jsonl"),
                        "Labels JSONL (see animegamer_jax/data/label_schema.py).", flag_values=fv)
    flags.DEFINE_string("out", "", "Output dataset directory (default: config.data.dataset_dir).", flag_values=fv)
    flags.DEFINE_integer("num_shards", 1, "ArrayRecord shards.", flag_values=fv)
    flags.DEFINE_bool("skip_bad", False, "Skip (and report) films that fail instead of stopping.", flag_values=fv)
    flags.DEFINE_bool("overwrite", False, "Replace an existing output directory.", flag_values=fv)
    cli_lib.define_verbosity(fv)


def main(argv: Sequence[str] | None = None) -> int:
    """Builds the dataset and prints the report; returns the exit status (2 with a one-line message on a
    bad command line or a bad input)."""
    return cli_lib.run_command("python -m animegamer_jax.data.prepare", argv, define_flags, __doc__, (), _run,
                               (FileNotFoundError, FileExistsError, ValueError))


def _run(f) -> int:
    """The body of :func:`main` on parsed flags ``f``."""
    cfg = f.config
    films = [parse_film_arg(a) for a in f.film or []]
    if f.film_dir:
        films += list_film_dir(f.film_dir)
    if not films:
        raise cli_lib.UsageError("give the films: --film=ID=PATH (repeatable) and/or --film_dir=DIR")
    report = prepare_dataset(films, f.labels, f.out or cfg.data.dataset_dir, cfg.data, num_shards=f.num_shards,
                             skip_bad=f.skip_bad, overwrite=f.overwrite,
                             log=lambda s: print(s, file=sys.stderr, flush=True))
    print(report.summary())
    return 0


def cli() -> None:
    """Console script ``animegamer-prepare`` (pyproject.toml)."""
    sys.exit(main())


if __name__ == "__main__":
    cli()
