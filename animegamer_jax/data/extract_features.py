r"""Precompute the shot encoder's frozen inputs per clip: f_v (CLIP) and f_md (T5), docs/encoders.md.

  python -m animegamer_jax.data.extract_features --config=configs/animegamer_2b_7b.py \
      --dataset=data/prepared/animegamer_samples --out=data/prepared/animegamer_samples_features \
      --clip_weights=open_clip_vit_b16_laion2b.bin --t5_weights=t5-v1_1-xxl/ \
      --t5_spiece=t5-v1_1-xxl/spiece.model --batch_size=16

  # smoke run on the tiny sample dataset with random weights (no downloads):
  python -m animegamer_jax.data.extract_features --config=configs/tiny.py \
      --dataset=data/prepared/tiny --out=data/prepared/tiny_features --random_init

For every clip of a prepared dataset (storage.py layout):

* ``f_v``  = CLIP ViT penultimate patch tokens of ``first_frame`` (uint8 -> [-1, 1] -> the
  release's preprocessing), (num_clips, 196, 768) at full size (docs/encoders.md#clip-image-tower);
* ``f_md`` = T5 encoder output of the clip's ``action`` text tokenized to ``t5.max_length`` (pad 0,
  EOS, no attention mask), (num_clips, 30, 4096) (docs/encoders.md#t5-action-text).

Output (a sidecar of the dataset; records are immutable ArrayRecords): ``<out>/f_v.npy``,
``<out>/f_md.npy`` (``np.lib.format`` files, memory-mappable), ``<out>/done.npy`` (bool per clip)
and ``<out>/meta.json`` (format, dataset, text field, config sections, weights). Resumable: a
batch's features are flushed before its ``done`` flags, so after a crash a rerun recomputes only
the clips not flagged done; a rerun against a different dataset / config / weights is refused
unless ``--overwrite``. Read with :func:`load_features`.

Batches are global (the same on every process), sharded over the mesh's batch axes
(``act_batch`` rule: data and fsdp); the last batch is padded by repeating its last clip and the
pads dropped. The mesh is ``config.mesh`` (``--mesh_shape`` overrides): with the paper config the
T5-XXL parameters are FSDP-sharded by their logical axes.
Weights: an orbax directory written by ``animegamer_jax.convert`` or a raw checkpoint converted on
the fly (open_clip / HF CLIP file; HF T5 safetensors file or folder).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags
from flax import nnx
from jax.experimental import multihost_utils
from ml_collections import config_flags
from tqdm import tqdm

from animegamer_jax import cli as cli_lib
from animegamer_jax import parallel, paths, video_io
from animegamer_jax.data.loader import ClipSource
from animegamer_jax.models.clip import convert as clip_convert
from animegamer_jax.models.clip.model import CLIPConfig, CLIPVisionTransformer
from animegamer_jax.models.t5 import convert as t5_convert
from animegamer_jax.models.t5.model import T5Config, T5Encoder
from animegamer_jax.t5_tokenizer import T5Tokenizer
from animegamer_jax.weights import load_state_dict, restore_state

FORMAT = "animegamer_jax.features/1"
FIELDS = ("f_v", "f_md")


class FeatureStoreError(ValueError):
    """An output directory that belongs to another extraction run (or is corrupt)."""


@dataclasses.dataclass
class ExtractReport:
    """num_clips in the dataset, computed now, already done before this run; seconds spent."""

    out_dir: str
    num_clips: int
    computed: int
    already_done: int
    seconds: float

    def summary(self) -> str:
        return (f"{self.out_dir}: {self.computed} clips computed, {self.already_done} already done, "
                f"{self.num_clips} in all, {self.seconds:.1f} s")


def _open_store(out_dir: str, num_clips: int, shapes: dict[str, tuple], dtype: str, meta: dict,
                overwrite: bool) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Creates or reopens the memmapped feature files; returns (field -> memmap, done memmap)."""
    if paths.is_url(out_dir):
        raise FeatureStoreError(f"--out {out_dir}: features are memory-mapped local files. Fix: a local folder "
                                f"or a gcsfuse mount of the bucket (`gcsfuse --implicit-dirs BUCKET /gcs/BUCKET`)")
    meta_path = os.path.join(out_dir, "meta.json")
    full_meta = {"format": FORMAT, "num_clips": num_clips, "dtype": dtype,
                 "shapes": {k: list(v) for k, v in shapes.items()}, **meta}
    fresh = overwrite or not os.path.isfile(meta_path)
    if not fresh:
        with open(meta_path, encoding="utf-8") as f:
            old = json.load(f)
        if old != json.loads(json.dumps(full_meta)):
            new = json.loads(json.dumps(full_meta))
            diff = sorted(k for k in set(old) | set(full_meta) if old.get(k) != new.get(k))
            raise FeatureStoreError(f"{out_dir} holds features of another run (differs in {diff}); "
                                    f"pass --overwrite to replace them or choose another --out")
        try:
            arrays = {k: np.lib.format.open_memmap(os.path.join(out_dir, f"{k}.npy"), mode="r+") for k in shapes}
            done = np.lib.format.open_memmap(os.path.join(out_dir, "done.npy"), mode="r+")
        except (OSError, ValueError) as e:
            raise FeatureStoreError(f"{out_dir}: unreadable feature files ({e}); pass --overwrite") from e
        return arrays, done
    os.makedirs(out_dir, exist_ok=True)
    arrays = {k: np.lib.format.open_memmap(os.path.join(out_dir, f"{k}.npy"), mode="w+", dtype=dtype,
                                           shape=(num_clips, *shp)) for k, shp in shapes.items()}
    done = np.lib.format.open_memmap(os.path.join(out_dir, "done.npy"), mode="w+", dtype=bool, shape=(num_clips,))
    done[:] = False
    done.flush()
    # meta last: a directory without meta.json is treated as fresh on the next run.
    with open(meta_path, "w", encoding="utf-8") as f:
        json.dump(full_meta, f, indent=1)
    return arrays, done


def load_features(out_dir: str, require_complete: bool = True) -> dict[str, np.ndarray]:
    """Read-only memmaps ``{"f_v": (N, Li, Dv), "f_md": (N, Lt, Dt), "done": (N,)}``.

    Raises:
      FeatureStoreError: not a feature directory, or (``require_complete``) clips not done.
    """
    meta_path = os.path.join(out_dir, "meta.json")
    if not os.path.isfile(meta_path):
        raise FeatureStoreError(f"{out_dir}: no meta.json; run `python -m animegamer_jax.data.extract_features`")
    with open(meta_path, encoding="utf-8") as f:
        meta = json.load(f)
    if meta.get("format") != FORMAT:
        raise FeatureStoreError(f"{meta_path}: format {meta.get('format')!r}, expected {FORMAT!r}")
    out = {k: np.load(os.path.join(out_dir, f"{k}.npy"), mmap_mode="r") for k in (*FIELDS, "done")}
    if require_complete and not out["done"].all():
        raise FeatureStoreError(f"{out_dir}: {int((~out['done']).sum())} of {len(out['done'])} clips not extracted; "
                                f"rerun to resume")
    return out


class FeatureEncoder:
    """Jitted (first frames uint8 (B, H, W, 3), T5 ids (B, Lt)) -> (f_v (B, Li, Dv), f_md (B, Lt, Dt)).

    Args:
      clip: CLIP vision tower (params possibly sharded).
      t5: T5 encoder.
      mesh, rules: the batch is split over the data axes of ``mesh`` (``act_batch`` rule).
    """

    def __init__(self, clip: CLIPVisionTransformer, t5: T5Encoder, mesh: jax.sharding.Mesh,
                 rules: parallel.mesh.LogicalRules = parallel.DEFAULT_RULES):
        self.clip, self.t5, self.mesh, self.rules = clip, t5, mesh, tuple(rules)

        @nnx.jit
        def run(clip, t5, frames, ids):
            images = video_io.from_uint8(frames)  # uint8 -> [-1, 1], inside the jitted program
            return clip.encode_reference(images).astype(jnp.float32), t5(ids).astype(jnp.float32)

        self._run = run

    def __call__(self, frames: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        with parallel.sharding_context(self.mesh, self.rules):
            frames_d, ids_d = parallel.shard_batch((frames, ids), self.mesh, self.rules)
            f_v, f_md = self._run(self.clip, self.t5, frames_d, ids_d)
        if jax.process_count() > 1:
            f_v, f_md = multihost_utils.process_allgather((f_v, f_md), tiled=True)
        return np.asarray(f_v), np.asarray(f_md)


def extract_features(dataset_dir: str, out_dir: str, encoder: FeatureEncoder,
                     tokenize: Callable[[list[str]], np.ndarray],
                     *, batch_size: int, text_field: str = "action", meta: dict | None = None, dtype: str = "float32",
                     overwrite: bool = False, max_batches: int | None = None, progress: bool = True) -> ExtractReport:
    """Computes f_v / f_md for every clip of ``dataset_dir`` not yet done in ``out_dir``.

    Args:
      dataset_dir: prepared clip dataset (``animegamer_jax.data.prepare``).
      out_dir: feature directory (created, or resumed).
      encoder: the jitted models (:class:`FeatureEncoder`).
      tokenize: texts -> (B, Lt) int32 T5 ids (``T5Tokenizer``).
      batch_size: global batch (a multiple of the mesh's data-parallel size).
      text_field: record field holding the action text (``action``; ``instruction`` is the full prompt).
      meta: extra identity of the run (config sections, weights) stored in / checked against meta.json.
      dtype: storage dtype (``float32`` or ``float16``).
      overwrite: start over even if ``out_dir`` holds another run.
      max_batches: stop after this many batches (time-boxed runs; rerun to resume).
      progress: show a tqdm bar on stderr.

    Raises:
      FeatureStoreError: ``out_dir`` holds another run (without ``overwrite``).
      parallel.ShardingConfigError: ``batch_size`` does not divide the data axes.
      storage.DatasetError: not a prepared dataset.
    """
    t0 = time.time()
    parallel.check_global_batch(batch_size, encoder.mesh, encoder.rules)
    source = ClipSource(dataset_dir, skip_fields=("frames",))
    n = len(source)
    first = source[0]
    if text_field not in first:
        raise KeyError(f"{dataset_dir}: records have no field {text_field!r} (fields: {sorted(first)})")
    text_len = tokenize([str(first[text_field])]).shape[1]
    shapes = {"f_v": (encoder.clip.cfg.num_patches, encoder.clip.cfg.vision_width),
              "f_md": (text_len, encoder.t5.cfg.d_model)}
    run_meta = {"dataset": os.path.abspath(dataset_dir), "text_field": text_field, **(meta or {})}
    writer = jax.process_index() == 0
    arrays, done = _open_store(out_dir, n, shapes, dtype, run_meta, overwrite) if writer else (None, None)
    pending = np.flatnonzero(~np.asarray(done)) if writer else np.arange(n)
    if jax.process_count() > 1:
        pending = np.asarray(multihost_utils.broadcast_one_to_all(np.isin(np.arange(n), pending)))
        pending = np.flatnonzero(pending)
    already = n - len(pending)
    batches = [pending[i:i + batch_size] for i in range(0, len(pending), batch_size)]
    if max_batches is not None:
        batches = batches[:max_batches]
    bar = None
    if progress:
        bar = tqdm(total=int(sum(len(b) for b in batches)), unit="clip", desc="f_v/f_md", file=sys.stderr)
    computed = 0
    for idx in batches:
        padded = np.concatenate([idx, np.full(batch_size - len(idx), idx[-1])])
        recs = [source[int(i)] for i in padded]
        frames = np.stack([r["first_frame"] for r in recs])
        ids = tokenize([str(r[text_field]) for r in recs])
        f_v, f_md = encoder(frames, ids)
        if writer:
            k = len(idx)
            arrays["f_v"][idx] = f_v[:k].astype(dtype)
            arrays["f_md"][idx] = f_md[:k].astype(dtype)
            for a in arrays.values():
                a.flush()
            done[idx] = True
            done.flush()
        computed += len(idx)
        if bar is not None:
            bar.update(len(idx))
    if bar is not None:
        bar.close()
    return ExtractReport(os.path.abspath(out_dir), n, computed, already, time.time() - t0)


def _is_orbax_dir(path: str) -> bool:
    return os.path.isdir(path) and any(n.startswith(("_CHECKPOINT_METADATA", "_METADATA")) for n in os.listdir(path))


def load_models(cfg: Any, mesh: jax.sharding.Mesh, rules, *, clip_weights: str = "", t5_weights: str = "",
                random_init: bool = False) -> tuple[CLIPVisionTransformer, T5Encoder]:
    """Builds the frozen CLIP vision tower and T5 encoder, parameters placed by their logical axes.

    Weights: orbax directory (``convert``) or raw checkpoint converted here; ``random_init``
    allows missing weights (smoke tests only).

    Raises:
      ValueError: a weight path missing without ``random_init``.
    """
    clip_cfg, t5_cfg = CLIPConfig.from_config(cfg.clip), T5Config.from_config(cfg.t5)
    specs = (
        ("clip", clip_weights, lambda: CLIPVisionTransformer(clip_cfg, rngs=nnx.Rngs(0)),
         lambda sd: clip_convert.convert_clip(sd, clip_cfg, vision_only=True)),
        ("t5", t5_weights, lambda: T5Encoder(t5_cfg, rngs=nnx.Rngs(1)), lambda sd: t5_convert.convert_t5(sd, t5_cfg)),
    )
    models = []
    for name, path, make, convert in specs:
        if not path:
            if not random_init:
                raise ValueError(f"--{name}_weights is required (or --random_init for a smoke run)")
            models.append(parallel.create_sharded_model(make, mesh, rules))
            continue
        abstract = nnx.eval_shape(make)
        graphdef, _ = nnx.split(abstract)
        state = restore_state(abstract, path) if _is_orbax_dir(path) else convert(load_state_dict(path))
        state = jax.device_put(state, parallel.param_shardings(state, mesh, rules))
        models.append(nnx.merge(graphdef, state))
    return models[0], models[1]


def define_flags(fv, argv: list[str]) -> None:
    """The flags of ``python -m animegamer_jax.data.extract_features`` on ``fv`` (absl + ml_collections)."""
    config_flags.DEFINE_config_file("config", paths.resource("configs/tiny.py"), "Config file (clip, t5, data, mesh "
                                    "sections).", flag_values=fv, lock_config=False, sys_argv=argv)
    flags.DEFINE_string("dataset", "", "Prepared dataset directory (default: config.data.dataset_dir).",
                        flag_values=fv)
    flags.DEFINE_string("out", "", "Feature directory (default: <dataset>_features).", flag_values=fv)
    flags.DEFINE_string("clip_weights", "", "CLIP weights: orbax dir, or open_clip / HF CLIP file.", flag_values=fv)
    flags.DEFINE_string("t5_weights", "", "T5 weights: orbax dir, or HF T5 safetensors file / folder.",
                        flag_values=fv)
    flags.DEFINE_string("t5_spiece", "", "T5 spiece.model (default: config.t5.spiece_model).", flag_values=fv)
    flags.DEFINE_bool("random_init", False, "Random weights where none are given (smoke runs only).", flag_values=fv)
    flags.DEFINE_integer("batch_size", 8, "Global batch (multiple of the data-parallel size).", flag_values=fv)
    flags.DEFINE_list("mesh_shape", None, "Mesh sizes (data,fsdp,tensor,context); default config.mesh.shape.",
                      flag_values=fv)
    flags.DEFINE_string("text_field", "action", "Record field with the action text.", flag_values=fv)
    flags.DEFINE_enum("dtype", "float32", ["float32", "float16"], "Storage dtype.", flag_values=fv)
    flags.DEFINE_integer("max_batches", None, "Stop after this many batches (rerun to resume).", flag_values=fv)
    flags.DEFINE_bool("overwrite", False, "Replace features of another run in --out.", flag_values=fv)
    flags.DEFINE_bool("progress", True, "Show a progress bar (--noprogress hides it).", flag_values=fv)
    cli_lib.define_verbosity(fv)


def main(argv: Sequence[str] | None = None) -> int:
    """Extracts the features and prints the report; returns the exit status (2 with a one-line message on a
    bad command line or a bad input)."""
    return cli_lib.run_command("python -m animegamer_jax.data.extract_features", argv, define_flags, __doc__, (),
                               _run, (FileNotFoundError, ValueError))


def _run(f) -> int:
    """The body of :func:`main` on parsed flags ``f``."""
    cfg = f.config
    if f.mesh_shape:
        mesh = parallel.make_mesh(tuple(int(s) for s in f.mesh_shape), tuple(cfg.mesh.axes))
    else:
        mesh = parallel.mesh_from_config(cfg)
    rules = parallel.rules_from_config(cfg)
    clip, t5 = load_models(cfg, mesh, rules, clip_weights=f.clip_weights, t5_weights=f.t5_weights,
                           random_init=f.random_init)
    tokenizer = T5Tokenizer(f.t5_spiece or cfg.t5.spiece_model, int(cfg.t5.max_length))
    meta = {"clip": cfg.clip.to_dict(), "t5": {k: v for k, v in cfg.t5.to_dict().items() if k != "spiece_model"},
            "clip_weights": os.path.abspath(f.clip_weights) if f.clip_weights else "random",
            "t5_weights": os.path.abspath(f.t5_weights) if f.t5_weights else "random"}
    dataset = f.dataset or cfg.data.dataset_dir
    report = extract_features(dataset, f.out or dataset.rstrip("/") + "_features",
                              FeatureEncoder(clip, t5, mesh, rules), tokenizer, batch_size=f.batch_size,
                              text_field=f.text_field, meta=json.loads(json.dumps(meta)), dtype=f.dtype,
                              overwrite=f.overwrite, max_batches=f.max_batches, progress=f.progress)
    print(report.summary())
    return 0


def cli() -> None:
    """Console script ``animegamer-extract-features`` (pyproject.toml)."""
    sys.exit(main())


if __name__ == "__main__":
    cli()
