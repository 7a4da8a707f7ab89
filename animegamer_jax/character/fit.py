"""``character fit``: a LoRA of the DiT for one character, from a few pictures of it (DreamBooth style).

The pictures (a folder of PNG / JPEG files, or the frames of a film) are checked as ``--character``
checks a reference (game/characters.py), then augmented (random horizontal flips and crops of
70-100 % of each side, fitted to the clip size) into ``variants`` still clips of the system's clip
length, VAE-encoded once (posterior mean, scaled). Training is phase a2's loss unchanged
(train/losses.py ``decoder_loss``: v-prediction MSE with E_a of the instruction ``Character: NAME;
Motion: calmly stands still; Background: a plain background.`` and the clip's first frame, the same
CFG dropouts) on the system's DiT with its own LoRA merged and a fresh LoRA of rank ``rank``
(models/layers.py, q/k/v/out of every layer) as the only trained parameters (Adam).

The result is a NEW system folder ``out``: the input system's files copied byte for byte
(checkpoint/add.py) with the component ``characters`` holding every stored character's LoRA
(models/cogvideox/character.py) and the manifest's ``characters`` entry naming them. The input
checkpoint is never modified; ``out`` must not exist.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from animegamer_jax.io import fileio

from animegamer_jax.io import paths

from animegamer_jax.tokenizers import t5_tokenizer

from animegamer_jax.io import media
from animegamer_jax.checkpoint import load_system, read_manifest, save_system, verify_checkpoint
from animegamer_jax.checkpoint.add import add_components
from animegamer_jax.checkpoint.store import load_config
from animegamer_jax.data.batches import flow_values
from animegamer_jax.game.characters import CharacterError, character_from_bytes, check_name, fit_image
from animegamer_jax.models.cogvideox import dit as dit_lib
from animegamer_jax.models.cogvideox.character import (COMPONENT, CharacterLoRAs, CharacterSpec, factors_from_dit)
from animegamer_jax.models.cogvideox.reference import ReferenceConfig
from animegamer_jax.models.layers import LoRAParam
from animegamer_jax.train.losses import decoder_loss

#: file name endings read from an --images folder
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
#: most frames taken from a --film (evenly spaced)
MAX_FILM_FRAMES = 64


class FitError(ValueError):
    """A bad ``character fit`` input; the message is one line with the fix."""


def instruction(name: str) -> str:
    """The instruction the character's clips are conditioned on (module docstring)."""
    return f"Character: {name}; Motion: calmly stands still; Background: a plain background."


def read_images(images: str | None, film: str | None, name: str,
                log: Callable[[str], None] = lambda s: None) -> list[np.ndarray]:
    """The pictures of the character, uint8 [H, W, 3] each: every PNG / JPEG file of the folder
    ``images`` (sorted by name; a name ending in :data:`IMAGE_SUFFIXES`, any case), or up to
    :data:`MAX_FILM_FRAMES` evenly spaced frames of ``film``. The folder's other files (a README.txt
    beside the pictures) and subfolders are skipped, named in one ``log`` line once the pictures
    are read.

    Raises:
      FitError: neither or both given, a missing folder or film, no PNG / JPEG in the folder.
      CharacterError: a PNG / JPEG file that is not a usable image (game/characters.py's checks).
    """
    if bool(images) == bool(film):
        raise FitError("give the pictures with --images DIR or a film with --film FILE (one of them)")
    if film:
        if not fileio.isfile(film):
            raise FitError(f"--film {film}: no such file. Fix: pass a video file of the character")
        try:
            frames, _ = media.read_video(film)
        except Exception as e:  # noqa: BLE001 - any decoder failure is a bad input file
            raise FitError(f"--film {film}: cannot be read as a video ({type(e).__name__}). Fix: pass an "
                           f"MP4/GIF/AVI film of the character") from None
        if not len(frames):
            raise FitError(f"--film {film}: the film has no frames. Fix: pass a film of the character")
        idx = np.unique(np.linspace(0, len(frames) - 1, min(len(frames), MAX_FILM_FRAMES)).round().astype(int))
        return [np.asarray(frames[i], np.uint8) for i in idx]
    if not fileio.isdir(images):
        raise FitError(f"--images {images}: no such folder. Fix: pass a folder of PNG or JPEG pictures")
    files = sorted(f for f in fileio.listdir(images) if not f.startswith("."))
    if not files:
        raise FitError(f"--images {images}: the folder is empty. Fix: put PNG or JPEG pictures of {name} in it")
    out, skipped = [], []
    for f in files:
        path = paths.join(images, f)
        if fileio.isdir(path) or not f.lower().endswith(IMAGE_SUFFIXES):
            skipped.append(f + ("/" if fileio.isdir(path) else ""))
            continue
        out.append(character_from_bytes(name, fileio.read_bytes(path), f"--images {path}").pixels())
    if not out:
        raise FitError(f"--images {images}: no PNG or JPEG picture in the folder ({len(skipped)} other file(s): "
                       f"{_names(skipped)}). Fix: put PNG or JPEG pictures of {name} in it")
    if skipped:
        log(f"--images {images}: {len(out)} picture(s); skipped {len(skipped)} file(s) that are not PNG or JPEG "
            f"pictures: {_names(skipped)}")
    return out


def _names(names: Sequence[str], most: int = 3) -> str:
    """``a, b, c and 2 more``."""
    return ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most else "")


def augment(pictures: Sequence[np.ndarray], n: int, height: int, width: int, seed: int) -> np.ndarray:
    """``n`` variants of the pictures, uint8 [n, height, width, 3]: picture ``i % len`` with a random
    crop (each side 70-100 %), a horizontal flip with probability 1/2 (not for the first variant of
    each picture, which is the whole picture), fitted with ``fit_image``."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        p = pictures[i % len(pictures)]
        if i >= len(pictures):
            h, w = p.shape[:2]
            ch, cw = int(h * rng.uniform(0.7, 1.0)), int(w * rng.uniform(0.7, 1.0))
            top, left = rng.integers(0, h - ch + 1), rng.integers(0, w - cw + 1)
            p = p[top:top + ch, left:left + cw]
            if rng.random() < 0.5:
                p = p[:, ::-1]
        out.append(fit_image(np.ascontiguousarray(p), height, width))
    return np.stack(out)


class _FitModel(nnx.Module):
    """The modules ``decoder_loss`` reads: the DiT (with the character LoRA), E_a, T5 and CLIP."""

    def __init__(self, dit, shot_encoder, t5, clip):
        self.dit, self.shot_encoder, self.t5, self.clip = dit, shot_encoder, t5, clip


def _dit_with_lora(dit: nnx.Module, rank: int, alpha: float, seed: int) -> nnx.Module:
    """The DiT with its own LoRA merged and a fresh LoRA of ``rank`` (A random, B zero: a no-op)."""
    base = dit_lib.merge_lora(dit)
    cfg = dataclasses.replace(base.cfg, lora_rank=rank, lora_alpha=alpha, param_dtype="float32")
    new = dit_lib.CogVideoXDiT(cfg, rngs=nnx.Rngs(seed))
    st = nnx.state(new, nnx.All(nnx.Param, nnx.Not(LoRAParam)))
    st.replace_by_pure_dict(jax.tree.map(lambda a: a.astype(jnp.float32), nnx.state(base, nnx.Param).to_pure_dict()))
    nnx.update(new, st)
    return new


def fit_character(checkpoint: str, out: str, name: str, pictures: Sequence[np.ndarray], *, steps: int = 300,
                  rank: int = 4, alpha: float | None = None, learning_rate: float = 2e-3, batch_size: int = 4,
                  variants: int = 32, seed: int = 0, overwrite: bool = False,
                  log: Callable[[str], None] = lambda s: None) -> dict:
    """Trains character ``name``'s LoRA on ``pictures`` and writes the system ``out`` (module docstring).

    Returns ``{"out", "names", "steps", "loss_first", "loss_last", "seconds"}`` (losses: mean v-MSE of
    the first / last 10 % of the steps).

    Raises:
      FitError: a missing checkpoint, ``out`` existing, ``name`` already stored without ``overwrite``,
        a bad ``steps`` / ``rank``.
      CharacterError: an unusable ``name``.
      SystemCheckpointError / CheckpointIntegrityError: a damaged checkpoint.
    """
    check_name(name, f"--name {name}")
    if steps < 1 or rank < 1 or batch_size < 1 or variants < 1:
        raise FitError("--steps, --rank, --batch_size and --variants must be at least 1")
    if not fileio.isdir(checkpoint):
        raise FitError(f"--checkpoint {checkpoint}: no such system checkpoint folder. Fix: pass a system "
                       f"folder, e.g. checkpoints/tiny_system")
    if fileio.exists(out):
        raise FitError(f"--out {out} exists; fit writes a new system folder (pick another folder)")
    verify_checkpoint(checkpoint, "fast")
    manifest = read_manifest(checkpoint)
    old = CharacterSpec.from_json(manifest.get(COMPONENT)) if COMPONENT in manifest["components"] else CharacterSpec(())
    if old.index(name) is not None and not overwrite:
        raise FitError(f"--name {name}: {checkpoint} already stores a character of that name. Fix: pass "
                       f"--overwrite to replace it, or another --name")
    if old.names and old.lora_rank != rank:
        raise FitError(f"--rank {rank}: {checkpoint} stores its characters at rank {old.lora_rank}. Fix: "
                       f"--rank={old.lora_rank}")
    alpha = float(rank if alpha is None else alpha)
    config = load_config(checkpoint)
    t0 = time.perf_counter()
    comps = load_system(checkpoint, config, names=["dit", "shot_encoder", "t5", "clip", "vae"], verify=None)
    model = _FitModel(_dit_with_lora(comps["dit"], rank, alpha, seed), comps["shot_encoder"], comps["t5"],
                      comps["clip"])

    # the still clips, VAE-encoded once
    num_frames, scale = int(config.data.num_frames), float(config.vae.scaling_factor)
    h, w = int(config.data.height), int(config.data.width)
    images = augment(pictures, max(variants, len(pictures)), h, w, seed)
    clips = np.broadcast_to(media.from_uint8(images)[:, None], (len(images), num_frames, h, w, 3))
    latents = np.concatenate([np.asarray(encode_latents(comps["vae"], clips[i:i + 4], scale))
                              for i in range(0, len(images), 4)])
    tok = t5_tokenizer.T5Tokenizer(paths.resource(config.t5.spiece_model), max_length=int(config.t5.max_length))
    ids = np.repeat(tok([instruction(name)]), batch_size, axis=0)
    flow = flow_values(np.ones(batch_size, np.int32), config.dit.flow_table)
    first = media.from_uint8(images).astype(np.float32)
    log(f"fit {name}: {len(pictures)} picture(s) -> {len(images)} still clips; training a rank-{rank} LoRA "
        f"for {steps} steps")

    trainable = nnx.All(LoRAParam, nnx.PathContains("dit"))
    graphdef, lora_state, rest = nnx.split(model, trainable, ...)
    opt = optax.adam(learning_rate)
    opt_state = opt.init(lora_state)

    @jax.jit
    def step(lora_state, opt_state, rest, batch, key):
        def f(ls):
            return decoder_loss(nnx.merge(graphdef, ls, rest), batch, key, config)[0]

        loss, grads = jax.value_and_grad(f)(lora_state)
        updates, opt_state = opt.update(grads, opt_state, lora_state)
        return optax.apply_updates(lora_state, updates), opt_state, loss

    rng = np.random.default_rng(seed)
    key = jax.random.key(seed)
    losses = []
    for s in range(steps):
        pick = rng.choice(len(images), batch_size, replace=len(images) < batch_size)
        batch = {"t5_ids": ids, "first_frame": first[pick], "flow": flow, "latents": latents[pick]}
        lora_state, opt_state, loss = step(lora_state, opt_state, rest, batch, jax.random.fold_in(key, s))
        losses.append(float(loss))
        if (s + 1) % max(1, steps // 10) == 0:
            log(f"  step {s + 1}/{steps}: v-MSE {np.mean(losses[-max(1, steps // 10):]):.4f}")
    nnx.update(model, lora_state)

    # every stored character: the input system's, with this one added (or replaced)
    ref_cfg = dataclasses.replace(ReferenceConfig.from_config(config.dit), lora_rank=rank, lora_alpha=alpha)
    fitted = factors_from_dit(model.dit, ref_cfg)
    loras = []
    if old.names:
        stored = load_system(checkpoint, config, names=[COMPONENT], verify=None,
                             builders={COMPONENT: lambda c, r: CharacterLoRAs(c.dit, old, rngs=r)})[COMPONENT]
        loras = list(stored.loras)
    names = list(old.names)
    i = old.index(name)
    if i is None:
        names.append(name)
        loras.append(fitted)
    else:
        names[i], loras[i] = name, fitted
    spec = CharacterSpec(tuple(names), rank, alpha)
    chars = CharacterLoRAs(config.dit, CharacterSpec(()), rngs=nnx.Rngs(0))
    chars.spec, chars.loras = spec, nnx.List(loras)

    out = str(paths.as_path(out))
    tmp = (paths.join(str(paths.as_path(out).parent), f".{paths.as_path(out).name}.characters-{uuid.uuid4().hex[:8]}")
           if not paths.is_url(out) else out.rstrip("/") + f".characters-{uuid.uuid4().hex[:8]}")
    try:
        save_system(tmp, {COMPONENT: chars}, config)
        add_components(checkpoint, tmp, out, [COMPONENT], replace=True, manifest_extra={COMPONENT: spec.as_json()})
    finally:
        if fileio.exists(tmp):
            fileio.rmtree(tmp)
    tail = max(1, steps // 10)
    return {"out": out, "names": names, "steps": steps, "loss_first": float(np.mean(losses[:tail])),
            "loss_last": float(np.mean(losses[-tail:])), "seconds": time.perf_counter() - t0}


def encode_latents(vae: nnx.Module, clips: np.ndarray, scale: float) -> jax.Array:
    """Still clips float [B, T, 8h, 8w, 3] in [-1, 1] -> scaled posterior-mean latents [B, t, C, h, w]."""
    return _encode(vae, jnp.asarray(clips, jnp.float32), scale)


@nnx.jit(static_argnums=2)
def _encode(vae, clips, scale):
    return (vae.encode(clips).mean * scale).astype(jnp.float32)



__all__ = ["CharacterError", "FitError", "augment", "fit_character", "instruction", "read_images"]
