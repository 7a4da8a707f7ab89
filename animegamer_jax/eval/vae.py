r"""Reconstruction PSNR of a system checkpoint's VAE on held-out frames of a prepared dataset's films.

  python -m animegamer_jax.eval.vae --checkpoint checkpoints/tiny_system [--dataset data/prepared/tiny_vae]
  python -m animegamer_jax.eval.vae --train_workdir WORKDIR --config configs/tiny.py \
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
import json
import os
import sys
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags
from flax import nnx
from ml_collections import config_flags

from animegamer_jax import cli as cli_lib
from animegamer_jax import paths, video_io
from animegamer_jax.checkpoint import SystemCheckpointError, load_config, load_system
from animegamer_jax.checkpoint.train_state import load_train_component
from animegamer_jax.config import ConfigError
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
    return video_io.to_unit(np.asarray(jax.device_get(y), np.float64))


def reconstruction_psnr(vae, held: Sequence[HeldOut], num_frames: int = 17) -> dict:
    """{"frame": dB, "clip": dB or None, "num_frames_scored", "num_clips", "per_film": {...}} for ``vae``
    (a ``CogVideoXVAE``) on ``held`` (see the module docstring)."""
    recon = nnx.jit(lambda m, x: m.decode(m.encode(x).mean))
    frame_scores, clip_scores, per_film = [], [], {}
    for h in held:
        f_scores = []
        for i in range(0, len(h.frames), 8):  # 8 single frames per call
            x = video_io.from_uint8(h.frames[i:i + 8])[:, None]
            y = model_frames_to_unit(recon(vae, jnp.asarray(x)))
            f_scores += [psnr(y[j], video_io.to_unit(x[j])) for j in range(len(x))]
        c_scores = []
        for sl in runs(h.indices, num_frames):
            x = video_io.from_uint8(h.frames[sl])[None]
            y = model_frames_to_unit(recon(vae, jnp.asarray(x)))
            c_scores.append(psnr(y, video_io.to_unit(x)))
        frame_scores += f_scores
        clip_scores += c_scores
        per_film[h.film_id] = {"frame": float(np.mean(f_scores)), "num_frames_scored": len(f_scores),
                               "clip": float(np.mean(c_scores)) if c_scores else None, "num_clips": len(c_scores)}
    return {"frame": float(np.mean(frame_scores)) if frame_scores else None,
            "clip": float(np.mean(clip_scores)) if clip_scores else None,
            "num_frames_scored": len(frame_scores), "num_clips": len(clip_scores), "per_film": per_film}


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


def define_flags(fv, argv: list[str]) -> None:
    """The flags of ``python -m animegamer_jax.eval.vae`` on ``fv`` (absl + ml_collections config_flags)."""
    config_flags.DEFINE_config_file("config", paths.resource("configs/tiny.py"),
                                    "With --train_workdir: the run's config file; --config.a.b=value overrides.",
                                    flag_values=fv, lock_config=False, sys_argv=argv)
    flags.DEFINE_string("checkpoint", "checkpoints/tiny_system", "System checkpoint holding a VAE.", flag_values=fv)
    flags.DEFINE_string("train_workdir", "", "Instead: the newest checkpoint of a 'vae' train --workdir.",
                        flag_values=fv)
    flags.DEFINE_string("dataset", "", "Prepared dataset whose clips the VAE trained on (default "
                        "train.vae_eval_dataset_dir, else train.vae_dataset_dir of the checkpoint's / run's config, "
                        "else data.dataset_dir).", flag_values=fv)
    flags.DEFINE_integer("frames", 17, "Frames per clip window (1 + 4k).", flag_values=fv)
    flags.DEFINE_integer("max_per_film", 0, "Score at most this many held-out frames per film (0: all).",
                         flag_values=fv)
    flags.DEFINE_string("json", "", "Also write the figures to this JSON file.", flag_values=fv)


def main(argv: list[str] | None = None) -> int:
    """Prints the held-out reconstruction PSNR; returns the exit status (2 with a message on bad input)."""
    return cli_lib.run_command("animegamer-eval-vae", argv, define_flags, __doc__, (), _run,
                               (ConfigError, FileNotFoundError, SystemCheckpointError, KeyError, ValueError, OSError))


def _run(f) -> int:
    """The body of :func:`main` on parsed flags ``f`` (a bad input raises; ``cli.run_command`` reports it)."""
    if f.train_workdir:
        config = f.config
        vae, step = vae_from_train_workdir(f.train_workdir, config)
        source = f"{os.path.abspath(f.train_workdir)} step {step}"
    else:
        config = load_config(f.checkpoint)
        vae = load_system(f.checkpoint, config, names=["vae"])["vae"]
        source = os.path.abspath(f.checkpoint)
    dataset = f.dataset or str(config.train.get("vae_eval_dataset_dir", "") or config.train.get("vae_dataset_dir", "")
                               or config.data.dataset_dir)
    # the set the "vae" phase read (pipeline.make_data): its clips must be the scored set's
    trained_on = str(config.train.get("vae_dataset_dir", "") or config.data.dataset_dir)
    if not f.dataset and os.path.abspath(trained_on) != os.path.abspath(dataset):
        if os.path.isdir(trained_on):
            check_same_segments(trained_on, dataset)
        else:
            print(f"note: {trained_on} (the VAE's training set) is not here, so the held-out frames of "
                  f"{dataset} are not checked against its clips", file=sys.stderr)
    held = held_out_frames(dataset, f.max_per_film)
    if not held:
        raise ValueError(f"{dataset}: every film frame lies in a clip; no held-out frames to score")
    res = reconstruction_psnr(vae, held, f.frames)
    res.update(checkpoint=source, dataset=os.path.abspath(dataset),
               height=int(held[0].frames.shape[1]), width=int(held[0].frames.shape[2]))
    for film, r in res["per_film"].items():
        clip = "n/a" if r["clip"] is None else f"{r['clip']:.2f} dB"
        print(f"{film}: frame PSNR {r['frame']:.2f} dB over {r['num_frames_scored']} held-out frames; "
              f"{f.frames}-frame clip PSNR {clip} over {r['num_clips']} clips")
    clip = "n/a" if res["clip"] is None else f"{res['clip']:.2f} dB"
    print(f"{source}: VAE reconstruction PSNR at {res['height']}x{res['width']} on held-out frames: frame "
          f"{res['frame']:.2f} dB ({res['num_frames_scored']} frames), clip {clip} ({res['num_clips']} clips of "
          f"{f.frames})")
    if f.json:
        with open(f.json, "w") as fh:
            json.dump(res, fh, indent=1)
    return 0


def cli() -> None:
    """Console script ``animegamer-eval-vae`` (pyproject.toml)."""
    raise SystemExit(main())


if __name__ == "__main__":
    cli()
