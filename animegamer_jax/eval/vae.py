r"""Reconstruction PSNR of a system checkpoint's VAE on held-out frames of a prepared dataset's films.

  python -m animegamer_jax.commands.eval vae --checkpoint checkpoints/tiny_system [--dataset data/prepared/tiny_vae]
  python -m animegamer_jax.commands.eval vae --train_workdir WORKDIR --config configs/tiny.py \
      --config.vae.latent_channels=16   # the newest checkpoint of a (running) "vae" phase, the run's overrides

Held-out frames: for every film of the dataset (its metadata.json, data/datasets.py), the source frames that lie in no
clip segment ``[start_time, end_time)`` of that dataset, i.e. frames the "vae" phase, which trains on
the dataset's clips, never sees (scene remainders shorter than a clip and whole shots shorter than
one: on the sample film two bikes.mp4 shots, the end of the bunny shot). They are
``resize_center_crop``-ed to the dataset's (height, width), as the clips are. The default dataset is
``train.vae_eval_dataset_dir`` when the config sets one: configs/tiny.py trains on the sample clips
stored at 128x192 (multi-scale crops) and scores on the same clip segments at the model's 64x96;
the command then refuses a scoring set whose segments differ from the training set's
(:func:`check_same_segments`). An explicit ``--dataset`` is scored as given.

Two figures (PSNR in dB of frames mapped to [0, 1], decoded output clipped to [0, 1], averaged over
units): ``frame`` encodes and decodes every held-out frame alone (T = 1); ``clip`` does
``--frames`` consecutive held-out source frames at once (default 17, the game's clip length) with the
VAE's default decode plan, over every window of a held-out run long enough (non-overlapping).
Posterior mean, no sampling.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from animegamer_jax.io import media
from animegamer_jax.checkpoint.train_state import load_train_component
from animegamer_jax.data import clips as clips_lib
from animegamer_jax.data import datasets, video


@dataclasses.dataclass
class HeldOut:
    """Held-out frames of one film: uint8 [N, H, W, 3] and their source frame indices (int [N])."""

    film_id: str
    frames: np.ndarray
    indices: np.ndarray


def held_out_frames(dataset_dir: str, max_per_film: int = 0) -> list[HeldOut]:
    """Frames of each film of ``dataset_dir`` outside every clip segment of the dataset.

    Raises:
      datasets.DatasetError: no prepared dataset; FileNotFoundError: a film file missing (the message names it).
    """
    index = datasets.read_index(dataset_dir)
    h, w = int(index["config"]["height"]), int(index["config"]["width"])
    out = []
    for film in index["films"]:
        path = film["path"]
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{path}: film '{film['film_id']}' of {dataset_dir} is missing; "
                                    f"rebuild it (data/README.md)")
        fps = video.probe(path).fps
        segs = [(c["start_time"], c["end_time"]) for c in index["clips"] if c["film_id"] == film["film_id"]]
        frames, idx = [], []
        for i, rgb in video.iter_frames(path):
            t = i / fps
            if any(a - 1e-6 <= t < b - 1e-6 for a, b in segs):
                continue
            frames.append(clips_lib.resize_center_crop(rgb, h, w))
            idx.append(i)
            if max_per_film and len(idx) >= max_per_film:
                break
        if frames:
            out.append(HeldOut(film["film_id"], np.stack(frames), np.asarray(idx)))
    return out


def check_same_segments(trained_on: str, scored_on: str) -> None:
    """Raises ValueError unless the two prepared datasets cut the same clip segments (film id, start,
    end) from their films: the frames held out of ``scored_on`` must be the frames the VAE, trained on
    ``trained_on`` (e.g. the same clips stored larger), never saw."""
    def segments(d):
        clips = datasets.read_index(d)["clips"]
        return sorted((c["film_id"], float(c["start_time"]), float(c["end_time"])) for c in clips)

    a, b = segments(trained_on), segments(scored_on)
    if a != b:
        diff = sorted(set(a) ^ set(b))[:3]
        raise ValueError(f"{scored_on} and the VAE's training set {trained_on} cut different clip segments "
                         f"(e.g. {diff}): its held-out frames would not be held out; rebuild both with the same "
                         f"clip plan (data/README.md), or score another dataset with --dataset")


def runs(indices: np.ndarray, length: int) -> list[slice]:
    """Non-overlapping windows of ``length`` consecutive source indices (slices into ``indices``)."""
    out, start = [], 0
    for k in range(1, len(indices) + 1):
        if k == len(indices) or indices[k] != indices[k - 1] + 1:
            for s in range(start, k - length + 1, length):
                out.append(slice(s, s + length))
            start = k
    return out


def psnr(x: np.ndarray, y: np.ndarray) -> float:
    """PSNR in dB of two arrays in [0, 1]."""
    mse = float(np.mean((np.asarray(x, np.float64) - np.asarray(y, np.float64)) ** 2))
    return float(10.0 * np.log10(1.0 / max(mse, 1e-12)))


def model_frames_to_unit(y) -> np.ndarray:
    """Model-space frames (any array in [-1, 1], e.g. a VAE decode) as float64 numpy in [0, 1], clipped."""
    return media.to_unit(np.asarray(jax.device_get(y), np.float64))


def reconstruction_psnr(vae, held: Sequence[HeldOut], num_frames: int = 17) -> dict:
    """{"frame": dB, "clip": dB or None, "num_frames_scored", "num_clips", "per_film": {...}} for ``vae``
    (a ``CogVideoXVAE``) on ``held`` (see the module docstring)."""
    recon = nnx.jit(lambda m, x: m.decode(m.encode(x).mean))
    frame_scores, clip_scores, per_film = [], [], {}
    for h in held:
        f_scores = []
        for i in range(0, len(h.frames), 8):  # 8 single frames per call
            x = media.from_uint8(h.frames[i:i + 8])[:, None]
            y = model_frames_to_unit(recon(vae, jnp.asarray(x)))
            f_scores += [psnr(y[j], media.to_unit(x[j])) for j in range(len(x))]
        c_scores = []
        for sl in runs(h.indices, num_frames):
            x = media.from_uint8(h.frames[sl])[None]
            y = model_frames_to_unit(recon(vae, jnp.asarray(x)))
            c_scores.append(psnr(y, media.to_unit(x)))
        frame_scores += f_scores
        clip_scores += c_scores
        per_film[h.film_id] = {"frame": float(np.mean(f_scores)), "num_frames_scored": len(f_scores),
                               "clip": float(np.mean(c_scores)) if c_scores else None, "num_clips": len(c_scores)}
    return {"frame": float(np.mean(frame_scores)) if frame_scores else None,
            "clip": float(np.mean(clip_scores)) if clip_scores else None,
            "num_frames_scored": len(frame_scores), "num_clips": len(clip_scores), "per_film": per_film}


def roundtrip(vae):
    """A function uint8 clip [T, H, W, 3] -> uint8 [T, H, W, 3]: ``vae`` (a ``CogVideoXVAE``) encodes it (posterior
    mean) and decodes it with its default decode plan, jitted once per shape (the referee's ceiling of a
    system's decoder, eval/referee_games.py)."""
    recon = nnx.jit(lambda m, x: m.decode(m.encode(x).mean))

    def run(frames: np.ndarray) -> np.ndarray:
        y = model_frames_to_unit(recon(vae, jnp.asarray(media.from_uint8(np.asarray(frames, np.uint8))[None])))[0]
        return np.clip(np.rint(y * 255.0), 0, 255).astype(np.uint8)

    return run


def vae_from_train_workdir(workdir: str, config) -> tuple[object, int]:
    """The VAE of the newest training checkpoint in ``WORKDIR/checkpoints`` of a "vae" phase run, built
    from ``config`` (the run's config and overrides) and read alone out of the train state
    (``checkpoint.train_state.load_train_component``); returns ``(vae, step)``. Read-only, so the run
    may still be going.

    Raises:
      FileNotFoundError: no complete checkpoint there; ValueError: the checkpoint was written under another
        config (VAE widths, blocks): the message says to pass the run's overrides.
    """
    return load_train_component(workdir, "vae", config)
