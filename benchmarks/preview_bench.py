"""The preview decoder against the full VAE decode: PSNR and wall time per clip, on this host.

Run (CPU, about a minute on 2 cores):
  python -m benchmarks.preview_bench --checkpoint runs/tiny_preview/system --dataset data/prepared/tiny

Latents: ``--count`` clips of the dataset evenly spaced (eval.decoder.clip_indices), VAE-encoded
(posterior mean x ``vae.scaling_factor``, the latents phase preview trains on). Each is decoded by play's
VAE stage (inference/vae_decode.py ``vae_decoder``: the same chunk plan / tiling) and by the preview
decoder as play runs it (inference/turn_model.py RealTurnModel: ``to_unit(preview(latents))``), both frames in [0, 1].
PSNR (dB, mean over clips) of the preview against the full decode, and of each against the clip's own
frames. Timing: one clip (batch 1), both jitted and warmed up, called alternately (ABAB) in this
process, ``--rounds`` each, median wall ms. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from animegamer_jax.io import media
from animegamer_jax.checkpoint import load_config, load_system
from animegamer_jax.data import loader
from animegamer_jax.eval.decoder import check_dataset, clip_indices
from animegamer_jax.eval.vae import psnr
from animegamer_jax.inference.vae_decode import vae_decoder
from animegamer_jax.models.cogvideox import preview as preview_lib
from benchmarks.common import interleaved, median


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", default="runs/tiny_preview/system")
    ap.add_argument("--dataset", default="data/prepared/tiny")
    ap.add_argument("--count", type=int, default=12)
    ap.add_argument("--rounds", type=int, default=10)
    a = ap.parse_args(argv)
    config = load_config(a.checkpoint)
    comps = load_system(a.checkpoint, config, names=["vae", "preview"])
    vae, prev = comps["vae"], comps["preview"]
    index = check_dataset(a.dataset, config)
    source = loader.ClipSource(a.dataset)
    picks = clip_indices(len(index["clips"]), a.count)
    scale = float(config.vae.scaling_factor)
    encode = nnx.jit(lambda m, x: m.encode(x).mean * scale)
    g_vae, s_vae = nnx.split(vae)
    decode, _, plan = vae_decoder(g_vae, vae.cfg, config)
    g_prev, s_prev = nnx.split(prev)
    params = {"vae": s_vae, "preview": s_prev}
    full = jax.jit(decode)
    fast = jax.jit(lambda p, z: media.to_unit(nnx.merge(g_prev, p["preview"])(z), media.VAE_RANGE))
    rows, lat = [], None
    for i in picks:
        frames = np.asarray(source[i]["frames"])[None]
        real = frames.astype(np.float64) / 255.0
        lat = encode(vae, jnp.asarray(media.from_uint8(frames)))
        y_full = np.asarray(full(params, lat), np.float64)
        y_prev = np.asarray(fast(params, lat), np.float64)
        rows.append({"index": int(i), "preview_vs_full": psnr(y_prev, y_full), "full_vs_real": psnr(y_full, real),
                     "preview_vs_real": psnr(y_prev, real)})
    jax.block_until_ready((full(params, lat), fast(params, lat)))  # warm (compiled above)
    t_full, t_prev = interleaved(lambda: jax.block_until_ready(full(params, lat)),
                                 lambda: jax.block_until_ready(fast(params, lat)), a.rounds)
    t, h, w = lat.shape[1], lat.shape[3], lat.shape[4]
    pcfg = prev.cfg
    out = {
        "checkpoint": a.checkpoint, "dataset": a.dataset, "clips": len(rows), "latents": [int(t), int(h), int(w)],
        "frames": [preview_lib.num_frames(t), int(y_full.shape[2]), int(y_full.shape[3])],
        "preview_channels": list(pcfg.channels), "preview_params": preview_lib.count_params(pcfg),
        "psnr_db": {k: float(np.mean([r[k] for r in rows])) for k in ("preview_vs_full", "full_vs_real",
                                                                       "preview_vs_real")},
        "wall_ms_per_clip": {"full": 1e3 * median(t_full), "preview": 1e3 * median(t_prev)},
        "full_plan": list(plan), "backend": jax.default_backend(), "rounds": a.rounds, "per_clip": rows,
    }
    out["speedup"] = out["wall_ms_per_clip"]["full"] / out["wall_ms_per_clip"]["preview"]
    print(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
