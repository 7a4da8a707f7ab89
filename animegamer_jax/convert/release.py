"""``convert release SRC DST``: the AnimeGamer release download -> one system checkpoint.

SRC is laid out like the release's ``checkpoints/`` folder (TencentARC/AnimeGamer README; the
fixture ``../shared/fixtures/release_tiny/release`` has the same layout)::

    Mistral-7B-Instruct-v0.1/                    HF folder (only read if the MLLM .bin lacks base weights)
    AnimeGamer/MLLM-<Character>/pytorch_model.bin         peft state dict of ContinuousLVLM_Video
    AnimeGamer/VDM_Decoder-<Character>/latest             "<iteration>" (or "release")
    AnimeGamer/VDM_Decoder-<Character>/<it>/mp_rank_00_model_states.pt   {'module': engine state dict}
    vae/3d-vae.pt                                 {'state_dict': encoder.*, decoder.*, loss.*}
    google/t5-v1_1-xxl/                           T5 v1.1 folder (used when the engine file has no T5)
    laion/CLIP-ViT-B-16-laion2B-s34B-b88K/open_clip_pytorch_model.bin   full OpenCLIP (text tower)

Where each component comes from (the key maps are the single-network converters' own; this module
only routes files and prefixes to them):

==============  =====================================================  ==============================
component       source                                                  converter
==============  =====================================================  ==============================
mllm            MLLM .bin (+ Mistral folder for absent base keys)        models/mistral/mllm_convert.py
dit             engine ``model.diffusion_model.*``                       models/cogvideox/dit_convert.py
shot_encoder    engine ``model.diffusion_model.mixins.patch_embed.*``    models/shot_encoder/convert.py
vae             ``vae/3d-vae.pt`` (else engine ``first_stage_model.*``)   models/cogvideox/vae_convert.py
t5              engine ``conditioner.embedders.0.transformer.*`` (else   models/t5/convert.py
                the T5 folder)
clip            engine ``clip_img_encoder.model.*`` + the OpenCLIP file's  models/clip/convert.py
                text ``transformer.*`` (the engine deletes that tower)
==============  =====================================================  ==============================

Keys dropped on purpose (see :data:`DROPPED`): the peft ``original_module`` norm copies (peft uses
``modules_to_save.default``), the recomputed ``pos_embed.pos_embedding`` table, E_a's unused
``output_mix_layer_norm``, the VAE ``loss.*`` entries, and DeepSpeed bookkeeping beside ``module``.

SRC and DST may be URLs (``gs://bucket/release``; etils.epath / fsspec). A remote SRC's files are
copied, as each is first needed, into a local cache folder by fsspec's whole-file cache
(``filecache::``; ``--cache_dir``, default a temporary folder removed afterwards; a user-given folder is
reused by a rerun while the remote files are unchanged), with one line per file saying so: ``torch.load(mmap=True)`` and
``safe_open`` memory-map local files only, and reading the engine file (many GB) through a stream would
hold all of it in memory instead of paging in one layer at a time. A remote DST is written in place
(``SystemWriter`` on the URL, integrity.json last as the completion marker, as orbax does on object
stores, which have no atomic folder rename) and removed again if the conversion fails.

Reads are lazy: torch files are memory-mapped (``torch.load(mmap=True)``) and safetensors are
opened with ``safe_open``, so a tensor is paged in only when its converter reads it, and the pages
are dropped again after each written group (:func:`drop_file_pages`). The MLLM and the DiT are
converted and written one leaf / one layer of a leaf at a time (``models.mistral.convert.mistral_leaves``,
``models.cogvideox.dit_convert.sat_layer``, ``checkpoint.SystemWriter``); the smaller networks one
component at a time. Everything goes into a temporary sibling of DST that is renamed to DST only
when every component is written: a failed conversion leaves nothing at DST. Every problem (missing
file, unreadable file, missing / unexpected / mis-shaped key, config whose sizes do not match) is
collected first and reported together, one line each, naming the file, the key and the fix.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np
from flax import nnx

from animegamer_jax import checkpoint
from animegamer_jax.convert import release_files
from animegamer_jax.convert.release_files import (CLIP_FILE, MISTRAL_DIR, T5_DIR, VAE_FILE, ReleaseError, ReleaseFiles,
                                                  absolute, drop_file_pages, find_files, load_folder_lazy,
                                                  load_torch_lazy, locate, one_line, relative)
from animegamer_jax.io import fileio
from animegamer_jax.io import paths
from animegamer_jax.models.clip import convert as clip_convert
from animegamer_jax.models.clip.model import CLIPConfig
from animegamer_jax.models.cogvideox import dit_convert, vae_convert
from animegamer_jax.models.cogvideox.dit import CogVideoXDiT, DiTConfig
from animegamer_jax.models.cogvideox.vae import VAEConfig
from animegamer_jax.models.mistral import mllm_convert
from animegamer_jax.models.mistral.convert import Leaf
from animegamer_jax.models.mistral.mllm import GameStateMLLM, MLLMConfig
from animegamer_jax.models.shot_encoder import convert as shot_encoder_convert
from animegamer_jax.models.shot_encoder.model import ShotEncoderConfig
from animegamer_jax.models.t5 import convert as t5_convert
from animegamer_jax.models.t5.model import T5Config, T5Encoder

#: engine-file prefixes and the component each feeds
ENGINE_PREFIXES = {
    "model.diffusion_model.": "dit",
    "conditioner.embedders.0.transformer.": "t5",
    "clip_img_encoder.model.": "clip",
    "first_stage_model.": "vae",
}
SHOT_ENCODER_PREFIX = "model.diffusion_model.mixins.patch_embed."
#: key pattern -> why the converter does not use it
DROPPED = {
    r"\.original_module\.weight$": "peft's frozen copy of a norm; peft runs modules_to_save.default",
    r"mixins\.pos_embed\.pos_embedding$": "fixed 3-D sin-cos table, recomputed by our DiT",
    r"mixins\.patch_embed\.output_mix_layer_norm\.": "E_a parameter the release never applies (docs/encoders.md)",
    r"^loss\.": "VAE training loss (the release loader drops it: ignore_keys ['loss'])",
    r"rotary_emb\.inv_freq$": "RoPE buffer, recomputed",
}
DEFAULT_CONFIG = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", "..", "configs", "animegamer_2b_7b.py"))


def dropped_reason(key: str) -> str | None:
    """Why ``key`` is not converted (a :data:`DROPPED` pattern), or None."""
    for pat, why in DROPPED.items():
        if re.search(pat, key):
            return why
    return None

# ----------------------------------------------------------------------------------------------
# Size checks (one line for a config that does not fit the weights)
# ----------------------------------------------------------------------------------------------
def _shape(sd: Mapping[str, Any], key: str) -> tuple[int, ...] | None:
    return tuple(int(d) for d in sd[key].shape) if key in sd else None


def _size_check(file: str, sd: Mapping[str, Any], key: str, want: tuple[int, ...], fields: str,
                config_path: str) -> str | None:
    got = _shape(sd, key)
    if got is None or got == tuple(want):
        return None
    return (f"{file}: key {key!r} has shape {got} but config {config_path} expects {tuple(want)} ({fields}); "
            f"the config's sizes do not match these weights. Fix: pass --config with the sizes of this "
            f"release (configs/animegamer_2b_7b.py for the real release, configs/release_tiny.py for the fixture)")


def _layer_count(sd: Mapping[str, Any], pattern: str) -> int:
    idx = {int(m.group(1)) for k in sd for m in [re.search(pattern, k)] if m}
    return max(idx) + 1 if idx else 0


# ----------------------------------------------------------------------------------------------
# Components
# ----------------------------------------------------------------------------------------------
FIX_KEYS = "use the release file for this component, unmodified, with the config of its sizes"


def _run(file: str, name: str, fn: Callable[[], Any]) -> Any:
    """Runs one single-network converter; its ConversionError becomes a one-line ReleaseError naming ``file``."""
    try:
        return fn()
    except ReleaseError:
        raise
    except ValueError as e:  # the converters' ConversionError
        raise ReleaseError([f"{file}: {name}: {one_line(e)[:4000]}. Fix: {FIX_KEYS}"]) from None


def _sub(sd: Mapping[str, Any], prefix: str, strip: bool = True) -> dict[str, Any]:
    return {(k[len(prefix):] if strip else k): v for k, v in sd.items() if k.startswith(prefix)}


def _keep(sd: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in sd.items() if dropped_reason(k) is None}


def _mllm(files: ReleaseFiles, config, config_path: str):
    m = config.mllm
    sd = load_torch_lazy(files.mllm)
    for key, want, fields in (
        ("llm.base_model.model.model.embed_tokens.weight", (m.vocab_size, m.hidden_size),
         "mllm.vocab_size, mllm.hidden_size"),
        ("output_resampler.proj.0.weight", (config.rep.dim, m.hidden_size), "rep.dim, mllm.hidden_size"),
    ):
        msg = _size_check(files.mllm, sd, key, want, fields, config_path)
        if msg:
            return None, [msg]
    n = _layer_count(sd, r"\.layers\.(\d+)\.")
    if n and n != m.num_layers:
        return None, [f"{files.mllm}: holds {n} decoder layers (keys ...layers.0..{n - 1}...) but config "
                      f"{config_path} has mllm.num_layers={m.num_layers}. Fix: pass --config with the sizes of "
                      f"this release"]
    llm_sd, rest = _run(files.mllm, "mllm", lambda: mllm_convert.normalize_peft_keys(sd))
    base_missing = "model.layers.0.self_attn.q_proj.weight" not in llm_sd
    if base_missing:
        if not files.mistral:
            return None, [f"{files.mllm}: holds no base weights (e.g. llm.base_model.model.model.layers.0.self_attn."
                          f"q_proj.base_layer.weight) and {paths.join(files.src, MISTRAL_DIR)} is absent. Fix: put "
                          f"the Mistral-7B-Instruct-v0.1 folder there"]
        mllm_convert.add_base_weights(sd, load_folder_lazy(files.mistral))
    cfg = MLLMConfig.from_config(config, lora_rank=0)
    cfg, leaves = _run(files.mllm, "mllm",
                       lambda: mllm_convert.animegamer_mllm_leaves(sd, cfg, lora_alpha=m.lora_alpha))
    if cfg.llm.lora_rank != m.lora_rank:
        return None, [f"{files.mllm}: LoRA rank {cfg.llm.lora_rank} (lora_A.default.weight rows) but config "
                      f"{config_path} has mllm.lora_rank={m.lora_rank}. Fix: set mllm.lora_rank={cfg.llm.lora_rank}"]
    if (tuple(cfg.llm.lora_targets) != tuple(sorted(m.lora_targets))
            and set(cfg.llm.lora_targets) != set(m.lora_targets)):
        return None, [f"{files.mllm}: LoRA on {list(cfg.llm.lora_targets)} but config mllm.lora_targets="
                      f"{list(m.lora_targets)}. Fix: set mllm.lora_targets to the modules the file has"]
    abstract = nnx.state(nnx.eval_shape(lambda: GameStateMLLM(cfg, rngs=nnx.Rngs(0))))
    want = _check_leaves(files.mllm, "mllm", abstract, leaves)
    return _LeafJob("mllm", want, leaves, [files.mllm] + ([files.mistral] if base_missing else [])), []


def _engine_check(files: ReleaseFiles, engine: Mapping[str, Any]) -> list[str]:
    """Engine keys outside every known prefix (unexpected)."""
    bad = sorted(k for k in engine if not k.startswith(tuple(ENGINE_PREFIXES)))
    if not bad:
        return []
    return [f"{files.engine}: unexpected keys ({len(bad)}) outside {sorted(ENGINE_PREFIXES)}: {bad[:20]}. "
            f"Fix: pass the SAT engine file of the AnimeGamer decoder (SATVideoDiffusionEngine state dict)"]


def _dit(files: ReleaseFiles, engine: Mapping[str, Any], config, config_path: str):
    d = config.dit
    nq = int(config.rep.num_text_tokens + config.rep.num_image_tokens)
    cfg = DiTConfig.from_config(d, text_length=nq)
    p = dit_convert.SAT_PREFIX
    for key, want, fields in (
        (p + "mixins.patch_embed.proj.weight", (cfg.hidden_size, cfg.in_channels, cfg.patch_size, cfg.patch_size),
         "dit.hidden_size, dit.in_channels, dit.patch_size"),
        (p + "time_embed.0.weight", (cfg.time_embed_dim, cfg.hidden_size), "dit.time_embed_dim, dit.hidden_size"),
    ):
        msg = _size_check(files.engine, engine, key, want, fields, config_path)
        if msg:
            return None, [msg]
    n = _layer_count(engine, r"^model\.diffusion_model\.transformer\.layers\.(\d+)\.")
    if n != cfg.num_layers:
        return None, [f"{files.engine}: holds {n} DiT layers (model.diffusion_model.transformer.layers.N) but config "
                      f"{config_path} has dit.num_layers={cfg.num_layers}. Fix: pass --config with the sizes of "
                      f"this release"]
    sd = _keep(_sub(engine, p, strip=False))
    sd, _extras, rank = _run(files.engine, "dit", lambda: dit_convert.sat_prepare(sd, cfg))
    top = _run(files.engine, "dit", lambda: dit_convert.sat_top_level(sd, cfg))
    layer0 = _run(files.engine, "dit", lambda: dit_convert.sat_layer(sd, cfg, rank, 0))
    leaves: dict[tuple, Any] = dict(top)
    for k, v in layer0.items():
        leaves[("blocks",) + k] = Leaf(None, v.shape, cfg.num_layers)
    abstract = nnx.state(nnx.eval_shape(lambda: CogVideoXDiT(cfg, rngs=nnx.Rngs(0))))
    want = _check_leaves(files.engine, "dit", abstract, leaves)
    return _DiTJob(want, top, sd, cfg, rank, [files.engine]), []


def _shot_encoder(files: ReleaseFiles, engine: Mapping[str, Any], config, config_path: str):
    cfg = ShotEncoderConfig.from_config(config)
    p = SHOT_ENCODER_PREFIX
    for key, want, fields in (
        (p + "text_proj.0.weight", (cfg.dim, cfg.text_dim), "rep.dim, shot_encoder.text_dim"),
        (p + "ip_proj.0.weight", (cfg.dim, cfg.image_dim), "rep.dim, shot_encoder.image_dim"),
    ):
        msg = _size_check(files.engine, engine, key, want, fields, config_path)
        if msg:
            return None, [msg]
    sd = _sub(engine, p, strip=False)
    return _run(files.engine, "shot_encoder", lambda: shot_encoder_convert.convert_shot_encoder(sd, cfg)), []


def _vae(files: ReleaseFiles, engine: Mapping[str, Any], config, config_path: str):
    cfg = VAEConfig.from_config(config.vae)
    if files.vae:
        file, sd = files.vae, load_torch_lazy(files.vae)
    elif any(k.startswith("first_stage_model.") for k in engine):
        file, sd = files.engine, _sub(engine, "first_stage_model.")
    else:
        return None, [f"{paths.join(files.src, VAE_FILE)}: file not found and {files.engine} has no "
                      f"first_stage_model.* keys. Fix: put the release's 3d-vae.pt there"]
    rev0 = cfg.block_out_channels[-1]
    msg = _size_check(file, sd, "decoder.conv_in.conv.weight", (rev0, cfg.latent_channels, 3, 3, 3),
                      "vae.block_out_channels[-1], vae.latent_channels", config_path)
    if msg:
        return None, [msg]
    return _run(file, "vae", lambda: vae_convert.sat_to_state(_keep(sd), cfg)), [], file


def _t5(files: ReleaseFiles, engine: Mapping[str, Any], config, config_path: str):
    cfg = T5Config.from_config(config.t5)
    p = "conditioner.embedders.0.transformer."
    if any(k.startswith(p) for k in engine):
        file, sd = files.engine, _sub(engine, p)
    elif files.t5:
        file, sd = files.t5, load_folder_lazy(files.t5)
    else:
        return None, [f"{files.engine}: no {p}* keys and {paths.join(files.src, T5_DIR)} is absent. "
                      f"Fix: put the google/t5-v1_1-xxl folder there"], None
    emb = "shared.weight" if "shared.weight" in sd else "encoder.embed_tokens.weight"
    msg = _size_check(file, sd, emb, (cfg.vocab_size, cfg.d_model), "t5.vocab_size, t5.d_model", config_path)
    if msg:
        return None, [msg], file
    # streamed: T5-XXL is 4.7 B float32 parameters, converted one layer of one leaf at a time
    values, r, prefix = _run(file, "t5", lambda: t5_convert.t5_leaves(_keep(sd), cfg))
    missing, unexpected = sorted(set(r.missing)), r.unexpected()
    shapes: dict[str, set] = {}
    for k in r.used:
        shapes.setdefault(re.sub(r"\.block\.\d+\.", ".block.N.", k), set()).add(tuple(np.shape(r.sd[k])))
    uneven = sorted(k for k, v in shapes.items() if len(v) > 1)
    if missing or unexpected or uneven:
        return None, [f"{file}: t5: T5 encoder (prefix {prefix!r}) does not match: missing source keys {missing[:20]}, "
                      f"unexpected source keys {unexpected[:20]}, layers of different shapes {uneven[:10]}. "
                      f"Fix: {FIX_KEYS}"], file
    for path, leaf in values.items():  # one layer of each stacked leaf proves its source shapes
        if isinstance(leaf, Leaf) and leaf.layers:
            got = tuple(_run(file, "t5", lambda leaf=leaf: leaf.fn(0)).shape)
            if got != leaf.shape:
                return None, [f"{file}: t5: {'/'.join(map(str, path))} converts to {got} per layer, model expects "
                              f"{leaf.shape}. Fix: {FIX_KEYS}"], file
    abstract = nnx.state(nnx.eval_shape(lambda: T5Encoder(cfg, rngs=nnx.Rngs(0))), nnx.Param)
    want = _check_leaves(file, "t5", abstract, values)
    return _LeafJob("t5", want, values, [files.engine if file == files.engine else file]
                    + (find_files(files.t5, "*.safetensors") if files.t5 else [])), [], file


def _clip(files: ReleaseFiles, engine: Mapping[str, Any], config, config_path: str):
    cfg = CLIPConfig.from_config(config.clip)
    p = "clip_img_encoder.model."
    sd = _sub(engine, p)
    file = files.engine
    if files.clip:
        full = load_torch_lazy(files.clip)
        if not sd:
            sd, file = full, files.clip
        else:  # the engine deletes the text transformer; the rest is bit-for-bit the standalone file's
            sd.update({k: v for k, v in full.items() if k.startswith("transformer.")})
            file = f"{files.engine} + {files.clip}"
    elif not sd:
        return None, [f"{files.engine}: no {p}* keys and {paths.join(files.src, CLIP_FILE)} is absent. "
                      f"Fix: put the OpenCLIP ViT-B-16 laion2b_s34b_b88k open_clip_pytorch_model.bin there"], None
    if not any(k.startswith("transformer.") for k in sd):
        return None, [f"{paths.join(files.src, CLIP_FILE)}: file not found; the engine's CLIP has no text "
                      f"tower (transformer.resblocks.*). Fix: put the OpenCLIP file there"], file
    msg = _size_check(file, sd, "visual.conv1.weight",
                      (cfg.vision_width, 3, cfg.patch_size, cfg.patch_size), "clip.vision_width, clip.patch_size",
                      config_path)
    if msg:
        return None, [msg], file
    return _run(file, "clip", lambda: clip_convert.convert_clip(sd, cfg)), [], file


# ----------------------------------------------------------------------------------------------
# Streaming jobs: checked before anything is written, then written leaf by leaf / layer by layer
# ----------------------------------------------------------------------------------------------
def _key(path: tuple) -> tuple[str, ...]:
    return tuple(str(getattr(p, "key", p)) for p in path)


def _check_leaves(file: str, name: str, abstract, leaves: Mapping[tuple, Any]) -> dict[tuple, tuple]:
    """Checks converted leaves against the module's abstract state; returns ``{path: (shape, dtype)}``.

    Raises:
      ReleaseError: missing / unexpected / mis-shaped parameters (one line, naming ``file``).
    """
    want = {_key(p): (tuple(v.get_raw_value().shape), v.get_raw_value().dtype) for p, v in nnx.to_flat_state(abstract)}
    got = {_key(p): ((v.layers,) + v.shape if v.layers else v.shape) if isinstance(v, Leaf) else tuple(np.shape(v))
           for p, v in leaves.items()}
    missing = sorted("/".join(p) for p in want if p not in got)
    extra = sorted("/".join(p) for p in got if p not in want)
    bad = sorted(f"{'/'.join(p)}: got {got[p]}, model expects {want[p][0]}"
                 for p in want if p in got and got[p] != want[p][0])
    if missing or extra or bad:
        raise ReleaseError([f"{file}: {name}: converted parameters do not match the model: missing {missing[:20]}, "
                            f"unexpected {extra[:20]}, mis-shaped {bad[:20]}. Fix: {FIX_KEYS}"])
    return want


class _StateJob:
    """A converted (small) component: every leaf written whole."""

    def __init__(self, name: str, state, sources: list[str]):
        self.name, self.state, self.sources = name, state, sources

    def write(self, writer) -> None:
        writer.add_state(self.name, self.state)
        writer.wait()
        self.state = None
        drop_file_pages(self.sources)


class _LeafJob:
    """Lazy leaves (``models.mistral.convert.Leaf``: one layer at a time) or arrays, cast to the model's dtypes."""

    def __init__(self, name: str, want: dict, leaves: dict, sources: list[str]):
        self.name, self.want, self.leaves, self.sources = name, want, leaves, sources

    def write(self, writer) -> None:
        for path, leaf in self.leaves.items():
            shape, dtype = self.want[_key(path)]
            if isinstance(leaf, Leaf) and leaf.layers:
                put = writer.stacked(self.name, _key(path), shape, dtype)
                for i in range(leaf.layers):
                    put(i, leaf.fn(i))
                    drop_file_pages(self.sources)
            else:
                value = leaf.fn() if isinstance(leaf, Leaf) else leaf
                writer.add(self.name, _key(path), np.asarray(value).astype(dtype))
                writer.wait()
                drop_file_pages(self.sources)
        self.leaves = {}


class _DiTJob:
    """The DiT: top-level leaves whole, the block leaves layer by layer (``sat_layer``)."""

    def __init__(self, want: dict, top: dict, sd, cfg, rank: int, sources: list[str]):
        self.want, self.top, self.sd, self.cfg, self.rank, self.sources = want, top, sd, cfg, rank, sources

    def write(self, writer) -> None:
        for path, v in self.top.items():
            writer.add("dit", _key(path), np.asarray(v).astype(self.want[_key(path)][1]))
        writer.wait()
        puts = {}
        for l in range(self.cfg.num_layers):
            layer = dit_convert.sat_layer(self.sd, self.cfg, self.rank, l)
            for k, v in layer.items():
                if k not in puts:
                    shape, dtype = self.want[("blocks",) + k]
                    puts[k] = writer.stacked("dit", ("blocks",) + k, shape, dtype)
                puts[k](l, v)
            del layer
            drop_file_pages(self.sources)


# ----------------------------------------------------------------------------------------------
# Writing
# ----------------------------------------------------------------------------------------------
COMPONENT_ORDER = ("mllm", "dit", "shot_encoder", "t5", "clip", "vae")  # cheap lazy checks first
#: file in a local conversion's temp folder naming its process (``fileio.owner_stamp``)
PARTIAL_OWNER = ".animegamer-owner"


def convert_release(src: str, dst: str, config, *, config_path: str = "", character: str | None = None,
                    log: Callable[[str], None] = print, cache_dir: str | None = None,
                    allow_pickle: bool = False) -> dict[str, int]:
    """Converts a release download at ``src`` into one system checkpoint at ``dst``.

    Args:
      src: the release's ``checkpoints/`` folder (module docstring layout), local or a URL.
      dst: the new system checkpoint directory (must not exist), local or a URL.
      config: the ml_collections config whose sizes the weights must have (saved in the checkpoint).
      config_path: shown in messages.
      character: the ``<Character>`` of ``MLLM-<Character>`` / ``VDM_Decoder-<Character>`` when SRC
        holds several.
      log: progress sink.
      cache_dir: local folder for the copies of a remote ``src``'s files (default: a temporary
        folder, removed afterwards); unused for a local ``src``.
      allow_pickle: read torch files with full pickle (only for files the user trusts); default the
        safe weights-only loader.

    Returns:
      ``{component: parameter count}`` as written to the manifest.

    A local ``dst`` is written into a sibling ``.<name>.partial-*`` folder renamed into place at the
    end; such folders that a killed conversion left (their process gone) are removed first.

    Raises:
      ReleaseError: every problem found, one line each; nothing is left at ``dst``.
    """
    dst = absolute(dst)
    if fileio.exists(dst):
        raise ReleaseError([f"{dst}: already exists. Fix: pass a new DST (this command never overwrites)"])
    files = locate(src, character)
    remote_dst = paths.is_url(dst)
    tmp = None
    if not remote_dst:  # a temporary sibling, renamed to DST at the end (atomic)
        parent = os.path.dirname(dst)
        os.makedirs(parent, exist_ok=True)
        prefix = f".{os.path.basename(dst)}.partial-"
        for name in os.listdir(parent):  # left by a killed conversion to the same DST
            if name.startswith(prefix) and fileio.owner_gone(os.path.join(parent, name, PARTIAL_OWNER)):
                shutil.rmtree(os.path.join(parent, name), ignore_errors=True)
                log(f"removed {name} (left by a killed conversion)")
        tmp = tempfile.mkdtemp(prefix=prefix, dir=parent)
        fileio.write_bytes_atomic(os.path.join(tmp, PARTIAL_OWNER), fileio.owner_stamp())
    problems: list[str] = []
    writer = None
    done = False
    with release_files.reading(cache_dir, log, allow_pickle):
        try:
            try:
                engine = load_torch_lazy(files.engine)
            except ReleaseError as e:
                problems += e.problems
                engine = None
            if engine is not None:
                problems += _engine_check(files, engine)
            writer = checkpoint.SystemWriter(dst if remote_dst else os.path.join(tmp, "system"), config)
            for name in COMPONENT_ORDER:
                t0 = time.perf_counter()
                file = files.mllm if name == "mllm" else files.engine
                try:
                    if name == "mllm":
                        job, errs = _mllm(files, config, config_path)
                    elif engine is None:
                        continue
                    else:
                        out = {"dit": _dit, "shot_encoder": _shot_encoder, "vae": _vae, "t5": _t5,
                               "clip": _clip}[name](files, engine, config, config_path)
                        job, errs = out[0], out[1]
                        if len(out) > 2 and out[2]:
                            file = out[2]
                except ReleaseError as e:
                    problems += e.problems
                    continue
                problems += errs
                if job is None or problems:  # keep checking the rest; write nothing more
                    continue
                if not hasattr(job, "write"):
                    job = _StateJob(name, job, [f for f in file.split(" + ")])
                job.write(writer)  # into the temporary directory; discarded on any later problem
                del job
                jax.clear_caches()
                shown = " + ".join(relative(f, files.src) for f in file.split(" + "))
                log(f"{name}: {writer.counts.get(name, 0):,} parameters from {shown} ({time.perf_counter() - t0:.1f} s)")
            if problems:
                raise ReleaseError(problems)
            writer.finish()
            checkpoint.read_manifest(writer.directory)
            if not remote_dst:
                os.rename(writer.directory, dst)
            counts = dict(writer.counts)
            done = True
        finally:
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
            if remote_dst and writer is not None and not done:
                fileio.rmtree(dst)  # created by this run (DST did not exist): a failed conversion leaves nothing
    return counts
