"""The VAE decoder step: a clip's latents -> frames in [0, 1].

(docs/diffusion.md#latent-scale.) ``decode(latents / scaling_factor)`` (spatially tiled when
``vae.tile_size`` > 0, or as the device's memory allows when -1) -> frames, mapped from [-1, 1] to
[0, 1] and clipped (``video_io.to_unit``; :data:`FRAME_RANGE`). Untiled, there is also
``decode_chunk``: one chunk of the same causal chunk plan (``vae.decode_chunks``) per call, the
cache carried by the caller, so a server can show the first frames while the rest decode.
"""

from __future__ import annotations

import logging
from types import SimpleNamespace

import jax
import jax.numpy as jnp
from flax import nnx

from animegamer_jax import parallel, video_io
from animegamer_jax.models.cogvideox.vae_tiling import resolve_decode_tiling

#: value range of the frames a system's ``decode`` returns (float32, clipped)
FRAME_RANGE = (0.0, 1.0)


def vae_spatial_shards(config, frame_hw: tuple[int, int], num_devices: int | None = None) -> int:
    """Devices one decoded frame ``[H, W]`` is split over by the config's mesh and rules (the VAE's
    ``act_height`` / ``act_width`` constraints; 8 in the latency layout on 8 devices, else 1)."""
    n = jax.device_count() if num_devices is None else int(num_devices)
    try:
        shape = parallel.resolve_mesh_shape(tuple(config.mesh.shape), n, tuple(config.mesh.axes))
    except parallel.ShardingConfigError:
        return 1
    mesh = SimpleNamespace(axis_names=tuple(config.mesh.axes), axis_sizes=shape)
    spec = parallel.logical_to_spec(("act_batch", "act_frames", "act_height", "act_width", "act_channels"),
                                    parallel.rules_from_config(config), shape=(1, 1, *frame_hw, 1), mesh=mesh)
    sizes = dict(zip(mesh.axis_names, shape))
    out = 1
    for entry in (spec[2], spec[3]):
        for a in ((entry,) if isinstance(entry, str) else (entry or ())):
            out *= sizes[a]
    return out


def vae_decoder(g_vae, vcfg, config, num_devices: int | None = None, device=None):
    """Play's VAE stage: ``(decode, decode_chunk, decode_plan)``.

    ``decode(p, latents [B, T, C, h, w] scaled) -> frames [B, F, H, W, 3]`` in [0, 1] with
    ``p["vae"]`` the VAE state: ``VAE_dec(latents / scaling_factor)``, tiled and chunked as
    ``vae_tiling.resolve_decode_tiling`` decides (``vae.tile_size`` -1: from the device's memory
    and the frame's shards on the mesh, :func:`vae_spatial_shards`). Untiled, ``decode_chunk(p,
    latents_chunk, cache) -> (frames, cache)`` runs one chunk of ``decode_plan`` (streaming);
    tiled, both are None / (). ``decode.why`` says what was chosen. ``num_devices``: the mesh's
    device count (default ``jax.device_count()``); ``device``: one device of that mesh, whose memory
    (or chip HBM, for compile-only devices) sets the tile budget (default ``jax.devices()[0]``). Used
    by :func:`build_real_system` and the ahead-of-time programs (animegamer_jax/aot).
    """
    scale = float(config.vae.scaling_factor)
    t, h, w = int(config.dit.num_latent_frames), int(config.dit.sample_height), int(config.dit.sample_width)
    sf = vcfg.spatial_factor
    shards = vae_spatial_shards(config, (sf * h, sf * w), num_devices)
    tile, plan, why = resolve_decode_tiling(vcfg, (t, h, w), shards=shards, device=device)
    logging.getLogger(__name__).info("VAE decode: %s", why)

    def decode(p, latents):
        vae = nnx.merge(g_vae, p["vae"])
        z = latents / scale
        video = vae.tiled_decode(z, tile_size=tile, plan=plan) if tile > 0 else vae.decode(z, plan)
        return _to_unit_frames(video, latents.shape)

    decode.why = why
    if tile > 0:
        return decode, None, ()

    def decode_chunk(p, latents, cache):
        # one step of CogVideoXVAE.decode's chunk loop (run_chunked), same plan and caches
        vae = nnx.merge(g_vae, p["vae"])
        z = jnp.moveaxis(latents / scale, 2, -1).astype(jnp.dtype(vae.cfg.dtype))
        video, cache = vae.decoder(z, cache)
        return _to_unit_frames(video.astype(jnp.float32), latents.shape), cache

    return decode, decode_chunk, tuple(plan)


def _to_unit_frames(video: jax.Array, latent_shape: tuple[int, ...]) -> jax.Array:
    """VAE output in [-1, 1] -> float32 [B, F, H, W, 3] in [0, 1] (docs/diffusion.md#latent-scale,
    ``video_io.to_unit``), accepting [B, F, H, W, 3] or the channels-first [B, 3, F, H, W] /
    [B, F, 3, H, W] layouts."""
    v = video.astype(jnp.float32)
    if v.ndim == 5 and v.shape[-1] != 3:
        v = jnp.moveaxis(v, 1 if v.shape[1] == 3 else 2, -1)
    return video_io.to_unit(v, video_io.VAE_RANGE)
