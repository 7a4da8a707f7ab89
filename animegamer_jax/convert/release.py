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

import ctypes
import dataclasses
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import fsspec
import jax
import numpy as np
from flax import nnx
from safetensors import safe_open

from animegamer_jax import checkpoint

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
MLLM_GLOB = "AnimeGamer/MLLM-*/pytorch_model.bin"
DECODER_GLOB = "AnimeGamer/VDM_Decoder-*"
VAE_FILE = "vae/3d-vae.pt"
T5_DIR = "google/t5-v1_1-xxl"
CLIP_FILE = "laion/CLIP-ViT-B-16-laion2B-s34B-b88K/open_clip_pytorch_model.bin"
MISTRAL_DIR = "Mistral-7B-Instruct-v0.1"
FIX_REDOWNLOAD = "download the file again and compare its size / SHA256 with the release"
#: ``--allow_pickle``: read torch files with full pickle (``weights_only=False``); off by default
ALLOW_PICKLE = False


class ReleaseError(ValueError):
    """A release folder that cannot be converted. ``problems``: one line per problem."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


def dropped_reason(key: str) -> str | None:
    """Why ``key`` is not converted (a :data:`DROPPED` pattern), or None."""
    for pat, why in DROPPED.items():
        if re.search(pat, key):
            return why
    return None


def one_line(msg: str) -> str:
    """A converter message on one line (newlines and runs of spaces folded)."""
    return re.sub(r"\s+", " ", re.sub(r"\x1b\[[0-9;]*m", "", str(msg))).strip()


def absolute(path: str) -> str:
    """A user path as shown and used: URLs unchanged, local paths absolute (``paths.as_path``)."""
    return str(paths.as_path(path))


def _glob(folder: str, pattern: str) -> list[str]:
    """``folder/pattern`` matches (local or URL), sorted."""
    p = paths.as_path(folder)
    return sorted(os.fspath(h) for h in p.glob(pattern)) if p.is_dir() else []


def _rel(path: str, root: str) -> str:
    return path[len(root.rstrip("/")) + 1:] if path.startswith(root.rstrip("/") + "/") else path


class LocalCache:
    """Local copies of a remote release's files, made by fsspec's ``filecache::`` as each file is first read.

    ``local(path)`` is ``path`` itself for local files; for a URL it is the file's copy in
    ``directory``, downloaded by fsspec's whole-file cache (``filecache::URL``; the file names are
    hashes of the URLs, and the cache's metadata file records each finished download), with one log
    line per file naming its size. A copy that an earlier run left in a user-given ``directory`` is
    reused while the remote object is unchanged (fsspec compares its ``ukey``); a download that failed
    part-way, or whose size is not the remote's, is dropped from the cache and raises ``OSError``.
    ``close()`` removes the folder when this object created it (a temporary one).
    """

    def __init__(self, directory: str | None = None, log: Callable[[str], None] = print):
        self.log = log
        self._own = directory is None
        self.directory = directory
        self.copies: dict[str, str] = {}

    def local(self, path: str) -> str:
        if not paths.is_url(path):
            return path
        if path in self.copies:
            return self.copies[path]
        if self.directory is None:
            self.directory = tempfile.mkdtemp(prefix="animegamer-release-cache-")
        cache, cached = fsspec.core.url_to_fs(f"filecache::{path}", filecache={
            "cache_storage": self.directory, "check_files": True, "expiry_time": False})
        size = int(cache.fs.size(path))
        self.log(f"copying {path} ({size / 2**30:.2f} GiB) to the local cache {self.directory} (unless an "
                 f"earlier run did): torch / safetensors memory-map local files only")
        try:
            with cache.open(cached, "rb") as f:
                out = f.name
            if os.path.getsize(out) != size:
                raise OSError(f"{path}: the local copy {out} holds {os.path.getsize(out)} of {size} bytes")
        except BaseException:
            cache.pop_from_cache(cached)  # never reused by a later read or run
            raise
        self.copies[path] = out
        return out

    def close(self) -> None:
        if self._own and self.directory:
            shutil.rmtree(self.directory, ignore_errors=True)
        self.copies = {}


#: the cache of the conversion in progress (``convert_release`` sets it); local files pass through
_cache = LocalCache()


# ----------------------------------------------------------------------------------------------
# Lazy reading
# ----------------------------------------------------------------------------------------------
class LazySafetensors(Mapping):
    """``{name: torch.Tensor}`` over safetensors files, each tensor read on access (bf16 kept)."""

    def __init__(self, files: list[str]):
        self._where: dict[str, Any] = {}
        self._handles = []
        for f in files:
            try:
                h = safe_open(_cache.local(f), framework="pt")
            except Exception as e:  # noqa: BLE001 - safetensors raises several error types
                raise ReleaseError([f"{f}: cannot read the safetensors header ({one_line(e)}); the file is "
                                    f"truncated or corrupt. Fix: {FIX_REDOWNLOAD}"]) from None
            self._handles.append(h)
            for k in h.keys():
                self._where[k] = (h, f)

    def __getitem__(self, key: str):
        h, f = self._where[key]
        try:
            return h.get_tensor(key)
        except Exception as e:  # noqa: BLE001
            raise ReleaseError([f"{f}: tensor {key!r} cannot be read ({one_line(e)}). Fix: {FIX_REDOWNLOAD}"]) from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._where)

    def __len__(self) -> int:
        return len(self._where)


def load_torch_lazy(path: str) -> dict[str, Any]:
    """A torch checkpoint memory-mapped (``torch.load(mmap=True, weights_only=True)``).

    ``{'module': sd}`` (SAT / DeepSpeed) and ``{'state_dict': sd}`` (``3d-vae.pt``) are unwrapped;
    the other DeepSpeed entries are bookkeeping and are not returned.

    Raises:
      ReleaseError: the file is missing, truncated or not a torch zip checkpoint (names the file).
    """
    import torch  # optional

    if not fileio.isfile(path):
        raise ReleaseError([f"{path}: file not found. Fix: put the release file there (see the layout "
                            f"in `python -m animegamer_jax.commands.convert release --help`)"])
    try:
        obj = torch.load(_cache.local(path), map_location="cpu", mmap=True, weights_only=not ALLOW_PICKLE)
    except Exception as e:  # noqa: BLE001 - torch raises RuntimeError / pickle errors / EOFError
        msg = one_line(e)
        if "weights_only" in msg or "Unsupported global" in msg:
            # e.g. a DeepSpeed file whose bookkeeping beside 'module' pickles Python objects
            raise ReleaseError([f"{path}: holds pickled Python objects beside the tensors ({msg[:160]}), which "
                                f"the safe loader refuses. Fix: if you trust the file (the release's own), rerun "
                                f"with --allow_pickle"]) from None
        raise ReleaseError([f"{path}: cannot be read as a torch checkpoint ({msg[:200]}); the file "
                            f"is truncated or corrupt. Fix: {FIX_REDOWNLOAD}"]) from None
    for k in ("module", "state_dict"):
        if isinstance(obj, Mapping) and isinstance(obj.get(k), Mapping):
            return dict(obj[k])
    if not isinstance(obj, Mapping):
        raise ReleaseError([f"{path}: holds a {type(obj).__name__}, not a state dict. Fix: {FIX_REDOWNLOAD}"])
    return dict(obj)


def load_folder_lazy(path: str) -> Mapping[str, Any]:
    """An HF folder's weights: ``*.safetensors`` (lazily) or ``pytorch_model*.bin`` (memory-mapped)."""
    st = _glob(path, "*.safetensors")
    if st:
        return LazySafetensors(st)
    bins = _glob(path, "pytorch_model*.bin")
    if not bins:
        raise ReleaseError([f"{path}: no *.safetensors or pytorch_model*.bin. Fix: put the release folder there"])
    out: dict[str, Any] = {}
    for b in bins:
        out.update(load_torch_lazy(b))
    return out


# ----------------------------------------------------------------------------------------------
# Locating the files
# ----------------------------------------------------------------------------------------------
@dataclasses.dataclass
class ReleaseFiles:
    """Paths of one character's release files under SRC (None: absent)."""

    src: str
    mllm: str
    engine: str
    vae: str | None
    t5: str | None
    clip: str | None
    mistral: str | None


def _one(src: str, pattern: str, character: str | None, what: str, problems: list[str]) -> str | None:
    hits = _glob(src, pattern)
    if character:
        hits = [h for h in hits if f"-{character}" in h]
    if not hits:
        problems.append(f"{paths.join(src, pattern)}: no {what} found. Fix: put the release's {what} there"
                        + (f" (for character {character!r})" if character else ""))
        return None
    if len(hits) > 1:
        problems.append(f"{paths.join(src, pattern)}: several {what}s {[_rel(h, src) for h in hits]}. "
                        f"Fix: choose one with --character NAME")
        return None
    return hits[0]


def locate(src: str, character: str | None = None) -> ReleaseFiles:
    """Finds the release files under ``src``.

    Raises:
      ReleaseError: SRC missing, the MLLM / decoder files missing or ambiguous, a bad ``latest``.
    """
    problems: list[str] = []
    src = absolute(src)
    if not fileio.isdir(src):
        raise ReleaseError([f"{src}: release folder not found. Fix: pass the folder that holds "
                            f"AnimeGamer/, vae/, google/, laion/ (the release's checkpoints/)"])
    mllm = _one(src, MLLM_GLOB, character, "MLLM pytorch_model.bin", problems)
    dec = _one(src, DECODER_GLOB, character, "VDM_Decoder folder", problems)
    engine = None
    if dec:
        latest = paths.join(dec, "latest")
        if not fileio.isfile(latest):
            problems.append(f"{latest}: file not found. Fix: the SAT folder needs `latest` naming the "
                            f"iteration folder (e.g. 10000)")
        else:
            it = paths.as_path(latest).read_text().strip()
            engine = paths.join(dec, it, "mp_rank_00_model_states.pt")
            if not fileio.isfile(engine):
                problems.append(f"{engine}: file not found (named by {latest}). Fix: put the decoder's "
                                f"mp_rank_00_model_states.pt there")
                engine = None
    if problems:
        raise ReleaseError(problems)

    def opt(rel: str) -> str | None:
        p = paths.join(src, rel)
        return p if fileio.exists(p) else None

    return ReleaseFiles(src, mllm, engine, opt(VAE_FILE), opt(T5_DIR), opt(CLIP_FILE), opt(MISTRAL_DIR))


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
                    + (_glob(files.t5, "*.safetensors") if files.t5 else [])), [], file


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


def drop_file_pages(files: list[str]) -> None:
    """Drops the resident pages of this process's private mappings of ``files`` (Linux; a remote
    file's local copy).

    The memory-mapped source files are read once, leaf by leaf; without this their clean file pages
    stay in the process's resident set. Pages are re-read from the file if touched again.
    """
    real = {os.path.realpath(q) for q in (_cache.copies.get(f, f) for f in files if f) if os.path.isfile(q)}
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        with open("/proc/self/maps", encoding="utf-8") as f:
            lines = f.readlines()
    except OSError:
        return
    for line in lines:
        parts = line.split(maxsplit=5)
        # torch maps checkpoints MAP_PRIVATE (``rw-p``); the converters never write into source
        # tensors, so every page there is a clean file page and dropping it loses nothing
        if len(parts) == 6 and parts[5].strip() in real and parts[1].endswith("p"):
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            libc.madvise(ctypes.c_void_p(lo), ctypes.c_size_t(hi - lo), 4)  # MADV_DONTNEED


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
    global _cache, ALLOW_PICKLE

    ALLOW_PICKLE = bool(allow_pickle)
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
    _cache = LocalCache(cache_dir, log)
    writer = None
    done = False
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
            shown = " + ".join(_rel(f, files.src) for f in file.split(" + "))
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
        _cache.close()
        _cache = LocalCache()
    return counts
