r"""Precompute the shot encoder's frozen inputs per clip, f_v (CLIP) and f_md (T5), as a tfds dataset built
by Apache Beam (data/clip_dataset/features.py), docs/encoders.md.

  python -m animegamer_jax.commands.data extract-features --config=configs/animegamer_2b_7b.py \
      --dataset=data/prepared/animegamer_samples --out=data/prepared/animegamer_samples_features \
      --clip_weights=open_clip_vit_b16_laion2b.bin --t5_weights=t5-v1_1-xxl/ \
      --t5_spiece=t5-v1_1-xxl/spiece.model --batch_size=16 [--dtype=float16] [--overwrite] \
      [--beam_pipeline_options=--runner=DirectRunner,--direct_num_workers=1]

  # smoke run on the tiny sample dataset with random weights (no downloads):
  python -m animegamer_jax.commands.data extract-features --config=configs/tiny.py \
      --dataset=data/prepared/tiny --out=data/prepared/tiny_features --random_init

For every clip of every split of a clip dataset (``data.prepare``):

* ``f_v``  = CLIP ViT penultimate patch tokens of ``first_frame`` (uint8 -> [-1, 1] -> the
  release's preprocessing), (196, 768) at full size (docs/encoders.md#clip-image-tower);
* ``f_md`` = T5 encoder output of the clip's ``action`` text tokenized to ``t5.max_length`` (pad 0,
  EOS, no attention mask), (30, 4096) (docs/encoders.md#t5-action-text).

Output: ``--out`` (default ``<dataset>_features``) is a tfds data_dir, like prepare's ``--out``: the
dataset lands in ``<out>/animegamer_clip_features/<P>x<Dv>-<Lt>x<Dt>-<dtype>/<version>/``, one ArrayRecord
record per clip, same splits and order as the clip dataset. Training reads it with
``--config.data.features_dir=<out>`` (``data/loader.py``). Atomic (``datasets.build``): nothing
appears at the final folder until it is complete; a stale incomplete folder of a killed run is
removed before building (one extraction per ``--out`` at a time). An existing dataset is replaced only
with ``--overwrite``, once the new one is complete. tfds builds are all-or-nothing: after a kill, rerun
the command, it starts over (``--max_batches`` and resuming from ``done.npy`` went with the old npy store;
``--progress`` too: Beam and tfds log their own progress).

Beam: per split, the record indices are cut into ranges of ``--batch_size`` (features.py says why);
each worker loads the models once (:class:`ModelLoader`) onto its own local devices: one mesh of
``jax.local_devices()`` on the ``fsdp`` axis, so a batch is split over all of them (data parallel)
and parameters with an ``embed``-like logical axis are FSDP-sharded (T5-XXL fits on one host's
accelerators). ``--batch_size`` must be a multiple of each worker's local device count. Workers
are independent: no jax.distributed, no cross-host collectives, hence no ``--mesh_shape`` any more
(the config's mesh is for training). On accelerators run one Beam worker per host (DirectRunner:
``--direct_num_workers=1``, the default in-process runner; Dataflow: one SDK process per VM), since
each worker takes all of its host's devices. Weights and the spiece model must be readable by the
workers.
Weights: an orbax directory written by ``python -m animegamer_jax.commands.convert`` or a raw checkpoint converted on
the fly (open_clip / HF CLIP file; HF T5 safetensors file or folder).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from animegamer_jax import parallel

from animegamer_jax.io import media
from animegamer_jax.data import datasets
from animegamer_jax.data.clip_dataset import features as features_lib
from animegamer_jax.data.loader import ClipSource
from animegamer_jax.models.clip import convert as clip_convert
from animegamer_jax.models.clip.model import CLIPConfig, CLIPVisionTransformer
from animegamer_jax.models.t5 import convert as t5_convert
from animegamer_jax.models.t5.model import T5Config, T5Encoder
from animegamer_jax.tokenizers.t5_tokenizer import T5Tokenizer
from animegamer_jax.weights import load_state_dict, restore_state

#: the mesh of a worker's local devices: everything on fsdp (batch split over data x fsdp, params FSDP)
WORKER_MESH_SHAPE = (1, -1, 1, 1)


@dataclasses.dataclass
class ExtractReport:
    """The feature dataset's version folder, clips per split, the Beam counters, seconds spent."""

    out_dir: str
    splits: dict[str, int]
    counters: dict[str, int]
    seconds: float

    def summary(self) -> str:
        return (f"wrote the features of {sum(self.splits.values())} clips to {self.out_dir} in {self.seconds:.1f} s "
                f"(splits: {self.splits}; counters: {self.counters})")


class FeatureEncoder:
    """Jitted (first frames uint8 (B, H, W, 3), T5 ids (B, Lt)) -> (f_v (B, Li, Dv), f_md (B, Lt, Dt)).

    Args:
      clip: CLIP vision tower (params possibly sharded).
      t5: T5 encoder.
      mesh, rules: the batch is split over the data axes of ``mesh`` (``act_batch`` rule); the mesh's
        devices belong to this process (a Beam worker's local devices).
    """

    def __init__(self, clip: CLIPVisionTransformer, t5: T5Encoder, mesh: jax.sharding.Mesh,
                 rules: parallel.mesh.LogicalRules = parallel.DEFAULT_RULES):
        self.clip, self.t5, self.mesh, self.rules = clip, t5, mesh, tuple(rules)

        @nnx.jit
        def run(clip, t5, frames, ids):
            images = media.from_uint8(frames)  # uint8 -> [-1, 1], inside the jitted program
            return clip.encode_reference(images).astype(jnp.float32), t5(ids).astype(jnp.float32)

        self._run = run

    def __call__(self, frames: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        with parallel.sharding_context(self.mesh, self.rules):
            frames_d, ids_d = parallel.shard_batch((frames, ids), self.mesh, self.rules)
            f_v, f_md = self._run(self.clip, self.t5, frames_d, ids_d)
        return np.asarray(f_v), np.asarray(f_md)


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


@dataclasses.dataclass(frozen=True)
class ModelLoader:
    """Picklable factory of a worker's encoder and tokenizer (``features.LoadEncoder``): called once per
    Beam worker (``EncodeClips.setup``), it builds the mesh of that worker's local devices
    (:data:`WORKER_MESH_SHAPE`), loads the models onto it and the T5 tokenizer.

    Args:
      config: the config (clip, t5, sharding_rules sections).
      clip_weights, t5_weights: as :func:`load_models` takes them ("" with ``random_init``).
      t5_spiece: T5 spiece.model ("" = ``config.t5.spiece_model``).
      batch_size: clips per call, checked against the worker's data-parallel size.
    """

    config: Any
    clip_weights: str = ""
    t5_weights: str = ""
    t5_spiece: str = ""
    random_init: bool = False
    batch_size: int = 8

    def __call__(self) -> tuple[FeatureEncoder, T5Tokenizer]:
        mesh = parallel.make_mesh(WORKER_MESH_SHAPE, devices=jax.local_devices())
        rules = parallel.rules_from_config(self.config)
        parallel.check_global_batch(self.batch_size, mesh, rules)
        # the package turns flax's eager sharding off at import, per thread; Beam calls setup() in a
        # worker thread of its own, which needs the same setting
        with nnx.use_eager_sharding(False):
            clip, t5 = load_models(self.config, mesh, rules, clip_weights=self.clip_weights,
                                   t5_weights=self.t5_weights, random_init=self.random_init)
        tokenizer = T5Tokenizer(self.t5_spiece or self.config.t5.spiece_model, int(self.config.t5.max_length))
        return FeatureEncoder(clip, t5, mesh, rules), tokenizer


def features_config(cfg: Any, dtype: str = "float32") -> features_lib.FeaturesConfig:
    """The feature dataset's BuilderConfig for the ``clip`` / ``t5`` sections of ``cfg``: f_v (P, Dv),
    f_md (t5.max_length, t5.d_model) in ``dtype``."""
    clip_cfg = CLIPConfig.from_config(cfg.clip)
    return features_lib.features_config(clip_cfg.num_patches, clip_cfg.vision_width, int(cfg.t5.max_length),
                                        int(cfg.t5.d_model), dtype)


def extract_features(dataset_dir: str, out_dir: str, load_encoder: features_lib.LoadEncoder,
                     config: features_lib.FeaturesConfig, *, batch_size: int, text_field: str = "action",
                     run_meta: dict | None = None, overwrite: bool = False, beam_pipeline_options: str = "",
                     log: Callable[[str], None] = lambda s: None) -> ExtractReport:
    """Builds the feature dataset of every split of ``dataset_dir`` into the tfds data_dir ``out_dir``.

    Args:
      dataset_dir: clip dataset (``data.prepare``; ``datasets.find``).
      out_dir: tfds data_dir to build into (local path or FUSE mount).
      load_encoder: picklable () -> (encoder, tokenize), called once per Beam worker (:class:`ModelLoader`).
      config: sizes and dtype of the features (:func:`features_config`).
      batch_size: clips per encoder call.
      text_field: record field holding the text T5 encodes (``action``; ``instruction`` is the full prompt).
      run_meta: the run's identity stored in metadata.json (config sections, weights).
      overwrite: replace a feature dataset already in ``out_dir``.
      beam_pipeline_options: comma-separated Beam options (beam_util.beam_options); "" = DirectRunner.
      log: progress callback.

    Raises:
      FileExistsError: ``out_dir`` holds a feature dataset and not ``overwrite``.
      ValueError: ``out_dir`` is a URL or holds another kind of dataset, no field ``text_field``, batch_size < 1.
      datasets.DatasetError: ``dataset_dir`` is not a clip dataset.
    """
    t0 = time.time()
    datasets.require_local(out_dir)
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    split_names = list(datasets.metadata(dataset_dir)["splits"])
    first = ClipSource(dataset_dir, skip_fields=("frames",), split=split_names[0])[0]
    if text_field not in first:
        raise ValueError(f"{dataset_dir}: records have no field {text_field!r} (fields: {sorted(first)})")

    def make_builder(data_dir: str) -> features_lib.AnimegamerClipFeatures:
        return features_lib.AnimegamerClipFeatures(
            dataset_dir=str(datasets.find(dataset_dir)), load_encoder=load_encoder, text_field=text_field,
            batch_size=batch_size, run_meta=json.loads(json.dumps(run_meta or {})), data_dir=data_dir, config=config,
            file_format="array_record")

    built = datasets.build(make_builder, out_dir, features_lib.NAME, overwrite=overwrite,
                           beam_pipeline_options=beam_pipeline_options, log=log)
    meta = datasets.metadata(built)
    return ExtractReport(built, {k: v["num_clips"] for k, v in meta["splits"].items()}, meta.get("counters", {}),
                         time.time() - t0)
