r"""Films + labels -> the clip dataset, a tfds dataset built by Apache Beam (data/clip_dataset/builder.py).

  python -m animegamer_jax.commands.data prepare --config=configs/tiny.py \
      --film=sample_film=data/prepared/sample_film.mp4 [--film_dir=DIR] --labels=data/sample_labels.jsonl \
      --out=data/prepared/tiny [--overwrite] \
      [--beam_pipeline_options=--runner=DirectRunner,--direct_num_workers=2,--direct_running_mode=multi_processing]

Per film, as one Beam element (paper Sec. 3.3 / App. B): decode, scene cuts, the 2 s clip plan, the
labels join, the clips' frames and their motion scope / level, appended one clip at a time to the
film's own ArrayRecord shard (one record per clip; a worker holds about one clip's frames). `--out` is the tfds data_dir: the dataset lands in
`<out>/animegamer_clips/<H>x<W>x<T>/<version>/` (data/datasets.py finds it from `<out>`). Films
named in `config.data.heldout_films` form the `heldout` split, the others `train`.
`--beam_pipeline_options` picks the engine (empty: DirectRunner in this process); the same command runs
on Dataflow, Flink or Spark (docs/data.md).

Atomic: tfds builds into `<out>/animegamer_clips/<config>/incomplete.XXXXXX_<version>/` and renames it
when every split and metadata.json are written; a crash leaves only that folder, which the next run
removes before it builds again (one prepare per `--out` at a time). An existing dataset is replaced
only with `--overwrite`.

Bad input: the labels file is checked before the pipeline starts (one-line error naming the file and
line). A film that cannot be decoded, is shorter than one clip or does not match its labels fails
alone: it is counted, listed in the report and in metadata.json's "skipped", and the rest is built
(`--skip_bad` is accepted for older command lines: this is always so). Clips marked `unlabelled` in
the labels file are left out and listed ("unlabelled").
"""

from __future__ import annotations

import dataclasses
import os
import re
import time
from collections.abc import Callable, Sequence

from animegamer_jax.io import paths
from animegamer_jax.data import datasets, label_schema, motion
from animegamer_jax.data.clip_dataset import builder as builder_lib

#: files of a dataset of the old layout (dataset.json + shards, format animegamer_jax.clips/1) that --overwrite replaces
_OLD_LAYOUT = re.compile(r"^(dataset\.json|clips\.array_record-\d{5}-of-\d{5})$")


@dataclasses.dataclass
class PrepareReport:
    """What prepare_dataset did: the dataset's version folder, clips written (per split), films skipped
    (film_id, path, reason), clips left out as unlabelled, motion scopes, Beam counters, seconds spent."""

    out_dir: str
    num_clips: int
    films: list[str]
    skipped: list[tuple[str, str, str]]
    motion_scopes: list[float]
    seconds: float
    unlabelled: list[tuple[str, int, str]] = dataclasses.field(default_factory=list)
    splits: dict[str, int] = dataclasses.field(default_factory=dict)
    counters: dict[str, int] = dataclasses.field(default_factory=dict)

    def summary(self) -> str:
        lines = [f"wrote {self.num_clips} clips of {len(self.films)} film(s) to {self.out_dir} "
                 f"in {self.seconds:.1f} s (splits: {self.splits}; counters: {self.counters})"]
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


def prepare_dataset(films: Sequence[tuple[str, str]], labels_path: str, out_dir: str, data_cfg,
                    overwrite: bool = False, beam_pipeline_options: str = "",
                    heldout_films: Sequence[str] | None = None,
                    log: Callable[[str], None] = lambda s: None) -> PrepareReport:
    """Builds the clip dataset of ``films`` into the tfds data_dir ``out_dir``.

    Args:
      films: (film_id, video path) pairs, in record order; ids must be unique.
      labels_path: labels JSONL (label_schema.py format).
      out_dir: tfds data_dir to build into (local path or FUSE mount).
      data_cfg: the `data` config section (sizes: builder.CONFIG_KEYS; heldout_films).
      overwrite: replace a dataset already in out_dir (of any clip size, or of the old layout).
      beam_pipeline_options: comma-separated Beam options (beam_util.beam_options); "" = DirectRunner.
      heldout_films: film ids of the `heldout` split (None: data_cfg.heldout_films).
      log: progress callback.

    Raises:
      FileExistsError: out_dir holds a dataset and not overwrite.
      label_schema.LabelError: the labels file is malformed (file and line).
      ValueError: out_dir is a URL, duplicate film ids, no film; builder.NoClipsError (a ValueError): a split
        with no clip (every film failed or every clip is unlabelled; the message lists the reasons).
    """
    t0 = time.time()
    datasets.require_local(out_dir)
    ids = [f for f, _ in films]
    if not ids:
        raise ValueError("no film given")
    if len(set(ids)) != len(ids):
        raise ValueError(f"duplicate film ids in {ids}")
    label_schema.read_labels(labels_path)  # a malformed file stops here, before any worker starts
    config = builder_lib.config_from_data(data_cfg)
    heldout = tuple(data_cfg.get("heldout_films", ()) if heldout_films is None else heldout_films)
    old_layout = sorted(n for n in os.listdir(out_dir) if _OLD_LAYOUT.match(n)) if os.path.isdir(out_dir) else []

    def make_builder(data_dir: str) -> builder_lib.AnimegamerClips:
        return builder_lib.AnimegamerClips(
            films=[(f, p if paths.is_url(p) else os.path.abspath(p)) for f, p in films],
            labels_path=os.path.abspath(labels_path), heldout_films=heldout, data_dir=data_dir, config=config,
            file_format="array_record")

    built = datasets.build(make_builder, out_dir, builder_lib.NAME, overwrite=overwrite,
                           beam_pipeline_options=beam_pipeline_options, replaces=old_layout, log=log)
    meta = datasets.metadata(built)
    clips = [c for split in meta["splits"].values() for c in split["clips"]]
    return PrepareReport(built, len(clips), [f["film_id"] for f in meta["films"]],
                         [(r["film_id"], r["path"], r["reason"]) for r in meta["skipped"]],
                         [float(c["motion_scope"]) for c in clips], time.time() - t0,
                         [(r["film_id"], r["clip_index"], r["reason"]) for r in meta["unlabelled"]],
                         {k: v["num_clips"] for k, v in meta["splits"].items()}, meta.get("counters", {}))
