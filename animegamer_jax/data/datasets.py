"""The tfds datasets that ``data.prepare`` and ``data.extract_features`` build: building one into a
data_dir (:func:`build`), finding it there, reading its metadata and opening a split.

A dataset directory (``--out`` of prepare, ``config.data.dataset_dir``) is a tfds ``data_dir``
holding one dataset: ``<dir>/<name>/<config>/<version>/`` with ``dataset_info.json``,
``features.json``, ``metadata.json`` and the ArrayRecord shards ``<name>-<split>.array_record-*``.
Every function here also takes the version folder itself. Reading needs no builder class:
``tfds.builder_from_directory`` rebuilds the features from ``features.json``.

``metadata.json`` (written by the builder, ``clip_dataset/builder.py``): format, config (the clip
sizes), labels, films, skipped (film, path, reason), unlabelled, counters and per split the clip
rows (everything but pixels; ``index`` = record index in the split).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Sequence

import tensorflow_datasets as tfds
from etils import epath

from animegamer_jax.io import fileio

from animegamer_jax.io import paths
from animegamer_jax.data.beam_util import beam_options

#: metadata.json formats this module reads (the clip dataset's, builder.FORMAT)
CLIP_FORMAT = "animegamer_jax.clips/2"
_REBUILD = "`python -m animegamer_jax.commands.data prepare` (docs/data.md)"


class DatasetError(ValueError):
    """A dataset directory is missing, incomplete, ambiguous or of another format."""


def find(dataset_dir: str) -> epath.Path:
    """The version folder of the one dataset in ``dataset_dir`` (or ``dataset_dir`` when it is one).

    Raises:
      DatasetError: no dataset there, a dataset of the old layout (dataset.json), or several datasets
        (the message lists them: pass one of them).
    """
    root = paths.as_path(paths.resource(dataset_dir))
    if (root / "dataset_info.json").exists():
        return root
    if (root / "meta.json").exists() and (root / "f_v.npy").exists():
        raise DatasetError(f"{dataset_dir}: features of the old layout (f_v.npy / meta.json, before tfds); rebuild "
                           f"them with `python -m animegamer_jax.commands.data extract-features` (docs/data.md)")
    if (root / "dataset.json").exists():
        raise DatasetError(f"{dataset_dir}: a dataset of the old layout (dataset.json, before tfds); rebuild it "
                           f"with {_REBUILD}")
    found = sorted(p.parent for p in root.glob("*/*/*/dataset_info.json")
                   if not p.parent.name.startswith("incomplete."))
    if not found:
        raise DatasetError(f"{dataset_dir}: not a prepared dataset (no <name>/<config>/<version>/dataset_info.json); "
                           f"build it with {_REBUILD}")
    if len(found) > 1:
        raise DatasetError(f"{dataset_dir} holds {len(found)} datasets ({', '.join(str(p) for p in found)}); "
                           f"pass one of these folders")
    return found[0]


def default_features_dir(dataset_dir: str) -> str:
    """``<data_dir>_features`` beside the clip dataset's data_dir (also when given its version folder)."""
    path = paths.as_path(paths.resource(dataset_dir))
    if (path / "dataset_info.json").exists():
        path = path.parent.parent.parent  # <data_dir>/<name>/<config>/<version>
    return str(path).rstrip("/") + "_features"


def metadata(dataset_dir: str) -> dict:
    """metadata.json of the dataset in ``dataset_dir`` plus ``name``, ``config_name``, ``version``, ``path``."""
    path = find(dataset_dir)
    meta_file = path / "metadata.json"
    if not meta_file.exists():
        raise DatasetError(f"{path}: no metadata.json; rebuild it with {_REBUILD}")
    meta = json.loads(meta_file.read_text())
    info = json.loads((path / "dataset_info.json").read_text())
    meta.update(name=info.get("name"), config_name=info.get("configName", ""), version=info.get("version"),
                path=str(path), split_names=[s["name"] for s in info.get("splits", [])])
    return meta


def read_index(dataset_dir: str, split: str = "train") -> dict:
    """One split of a clip dataset as a dict: format, config, name, version, path, films, skipped, unlabelled,
    labels, ``num_clips`` and ``clips`` (rows of that split; ``index`` is the record index), and
    ``feature_fields`` (empty: features are a dataset of their own, data/extract_features.py).

    Raises:
      DatasetError: not a clip dataset (find), or no such split (the message names the splits there).
    """
    meta = metadata(dataset_dir)
    if meta.get("format") != CLIP_FORMAT:
        raise DatasetError(f"{meta['path']}: format {meta.get('format')!r}, expected {CLIP_FORMAT!r}; "
                           f"rebuild it with {_REBUILD}")
    if split not in meta["splits"]:
        raise DatasetError(f"{meta['path']}: no split {split!r} (splits: {sorted(meta['splits'])})")
    out = {k: v for k, v in meta.items() if k != "splits"}
    out.update(split=split, num_clips=int(meta["splits"][split]["num_clips"]), clips=meta["splits"][split]["clips"],
               feature_fields=[])
    return out


def dataset_fingerprint(index: dict) -> str:
    """``"sha256:<16 hex>"`` of what a split of a dataset holds, from :func:`read_index`: the dataset's tfds
    identity (name, config, version, split), the clip config and rows (film, times, instruction, states,
    motion), not where it lies, so a copy or a move has the same fingerprint and a dataset prepared again
    from other films or labels has another one. Training refuses to resume on other data with it
    (``train.pipeline.run_meta``)."""
    content = {k: index.get(k) for k in ("name", "config_name", "version", "split", "config", "num_clips", "clips",
                                         "feature_fields")}
    digest = hashlib.sha256(json.dumps(content, sort_keys=True).encode("utf-8")).hexdigest()
    return f"sha256:{digest[:16]}"


def open_split(dataset_dir: str, split: str = "train"):
    """Random access to one split: a tfds ArrayRecord data source (``len``, ``[i]`` -> dict of numpy
    arrays, text as bytes), records in key order.

    Raises:
      DatasetError: ``dataset_dir`` is a URL: open-source ArrayRecord reads local files only, so a
        dataset in a bucket is read through a FUSE mount (the message gives the command); no such split.
    """
    if paths.is_url(dataset_dir):
        bucket = dataset_dir.split("://", 1)[1].split("/", 1)[0]
        raise DatasetError(
            f"{dataset_dir}: ArrayRecord shards cannot be read from a URL (array_record opens local files). "
            f"Fix: mount the bucket, e.g. `gcsfuse --implicit-dirs {bucket} /gcs/{bucket}`, and pass "
            f"/gcs/{dataset_dir.split('://', 1)[1]} (checkpoints, TensorBoard and outputs can stay on gs://)")
    builder = tfds.builder_from_directory(find(dataset_dir))
    if split not in builder.info.splits:
        raise DatasetError(f"{find(dataset_dir)}: no split {split!r} (splits: {sorted(builder.info.splits)})")
    return builder.as_data_source(split=split)


def build(make_builder: Callable[[str], tfds.core.DatasetBuilder], out_dir: str, name: str, *,
          overwrite: bool = False, beam_pipeline_options: str = "",
          replaces: Sequence[str] = (), log: Callable[[str], None] = lambda s: None) -> str:
    """Builds the tfds dataset ``name`` into the data_dir ``out_dir``; returns its version folder.

    Nothing appears at ``out_dir/name/<config>/<version>`` until the build is complete (tfds' incomplete
    folder, renamed at the end). A dataset already there (any config of ``name``, and the ``replaces``
    paths, relative to ``out_dir``) is kept until the new one is complete: with ``overwrite`` the new one
    is built in a hidden ``out_dir/.building-*`` folder and swapped in. Incomplete and ``.building-*``
    folders that a killed run left are removed first (one build per ``out_dir`` at a time). A build that
    fails into an ``out_dir`` it created removes that folder again.

    Args:
      make_builder: data_dir -> the builder (tfds builds into it).
      beam_pipeline_options: comma-separated Beam options (beam_util.beam_options); "" = DirectRunner.

    Raises:
      ValueError: ``out_dir`` is a URL (array_record writes local files: the message gives the gcsfuse
        fix) or holds a dataset of another name.
      FileExistsError: a dataset is there and not ``overwrite``.
    """
    require_local(out_dir)
    out_dir = os.path.abspath(out_dir)
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise ValueError(f"--out {out_dir} is a file; give a folder (the tfds data_dir to build into)")
    inside = [str(p) for p in epath.Path(out_dir).parents if (p / "dataset_info.json").exists()]
    if (epath.Path(out_dir) / "dataset_info.json").exists() or inside:
        raise ValueError(f"--out {out_dir} is inside a dataset ({(inside or [out_dir])[0]}); give a data_dir of "
                         f"its own, e.g. a sibling folder")
    versions = _versions(out_dir)
    others = [v for v in versions if not v.startswith(name + os.sep)]
    if others:
        raise ValueError(f"--out {out_dir} holds other datasets ({', '.join(others)}); {name} needs a data_dir of "
                         f"its own (readers find the one dataset in it)")
    existing = versions + [r for r in replaces if os.path.lexists(os.path.join(out_dir, r))]
    if existing and not overwrite:
        raise FileExistsError(f"{out_dir} holds a dataset ({', '.join(existing)}); pass --overwrite to replace it "
                              f"or choose another --out")
    for stale in _leftovers(out_dir, name):
        log(f"removing {stale}: the incomplete build of an earlier run that stopped")
        fileio.rmtree(stale)
    options = beam_options(beam_pipeline_options)  # a bad option stops here, before anything is written
    created = not os.path.exists(out_dir)
    fileio.makedirs(out_dir)
    build_dir = tempfile.mkdtemp(prefix=".building-", dir=out_dir) if existing else out_dir
    downloads = tempfile.mkdtemp(prefix=".tfds-downloads-", dir=out_dir)
    ok = False
    try:
        builder = make_builder(build_dir)
        builder.download_and_prepare(download_dir=downloads, download_config=tfds.download.DownloadConfig(
            beam_options=options,
            download_mode=tfds.download.GenerateMode.REUSE_DATASET_IF_EXISTS))
        rel = os.path.relpath(os.fspath(builder.data_dir), build_dir)
        if build_dir != out_dir:
            trash = os.path.join(build_dir, ".replaced")
            fileio.makedirs(trash)
            moved = []
            try:
                for k, old in enumerate(existing):
                    log(f"replacing {os.path.join(out_dir, old)}")
                    fileio.rename(os.path.join(out_dir, old), os.path.join(trash, str(k)))
                    moved.append((k, old))
                fileio.makedirs(os.path.dirname(os.path.join(out_dir, rel)))
                fileio.rename(os.path.join(build_dir, rel), os.path.join(out_dir, rel))
            except BaseException:  # put the old dataset back: never lose both
                for k, old in moved:
                    if not os.path.lexists(os.path.join(out_dir, old)):
                        fileio.rename(os.path.join(trash, str(k)), os.path.join(out_dir, old))
                raise
            for old in existing:  # config folders left empty
                parent = os.path.dirname(os.path.join(out_dir, old))
                if parent != out_dir and os.path.isdir(parent) and not os.listdir(parent):
                    os.rmdir(parent)
        ok = True
    finally:
        fileio.rmtree(downloads)
        if build_dir != out_dir:
            fileio.rmtree(build_dir)
        if not ok and created and os.path.isdir(out_dir):  # a failed build leaves no folder this run made
            fileio.rmtree(out_dir)
    return os.path.join(out_dir, rel)


def require_local(out_dir: str) -> None:
    """Raises ValueError, naming the gcsfuse fix, when ``out_dir`` is a URL: array_record writes local files."""
    if paths.is_url(out_dir):
        raise ValueError(f"--out {out_dir}: ArrayRecord shards are written to local files (array_record has no "
                         f"URL support). Fix: write to a local folder or a gcsfuse mount of the bucket "
                         f"(`gcsfuse --implicit-dirs BUCKET /gcs/BUCKET`), e.g. /gcs/{out_dir.split('://', 1)[1]}")


def _versions(out_dir: str) -> list[str]:
    """Complete version folders ``<name>/<config>/<version>`` (with dataset_info.json) in a data_dir."""
    if not os.path.isdir(out_dir):
        return []
    return sorted(os.path.relpath(str(p.parent), out_dir) for p in epath.Path(out_dir).glob("*/*/*/dataset_info.json")
                  if not p.parent.name.startswith("incomplete.") and not p.parts[-4].startswith("."))


def _leftovers(out_dir: str, name: str) -> list[str]:
    """What a killed build of ``name`` left in ``out_dir``: ``.building-*`` and ``.tfds-downloads-*`` folders and tfds' incomplete
    folders (``<name>/<config>/incomplete.XXXXXX_<version>``)."""
    if not os.path.isdir(out_dir):
        return []
    found = [os.path.join(out_dir, n) for n in os.listdir(out_dir) if n.startswith((".building-", ".tfds-downloads-"))]
    root = os.path.join(out_dir, name)
    if os.path.isdir(root):
        found += [os.path.join(root, c, v) for c in os.listdir(root) if os.path.isdir(os.path.join(root, c))
                  for v in os.listdir(os.path.join(root, c)) if v.startswith("incomplete.")]
    return sorted(found)
