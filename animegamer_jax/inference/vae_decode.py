"""The VAE decoder step: a clip's latents -> frames in [0, 1].

(docs/diffusion.md#latent-scale.) ``decode(latents / scaling_factor)`` (spatially tiled when
``vae.tile_size`` > 0, or as the device's memory allows when -1) -> frames, mapped from [-1, 1] to
[0, 1] and clipped (``media.to_unit``; :data:`FRAME_RANGE`). Untiled, there is also
``decode_chunk``: one chunk of the same causal chunk plan (``vae.decode_chunks``) per call, the
cache carried by the caller, so a server can show the first frames while the rest decode.
"""

from __future__ import annotations

import logging
import sys
from types import SimpleNamespace

import jax
import jax.numpy as jnp
from flax import nnx

from animegamer_jax import parallel

from animegamer_jax.io import media
from animegamer_jax.models.cogvideox import vae_tiling
from animegamer_jax.models.cogvideox.vae_tiling import resolve_decode_tiling

#: value range of the frames a system's ``decode`` returns (float32, clipped)
FRAME_RANGE = (0.0, 1.0)


def vae_spatial_shards(config, frame_hw: tuple[int, int], num_devices: int | None = None) -> int:
    """Devices one decoded frame ``[h, w]`` is split over by the config's mesh and rules (the VAE's
    ``act_height`` / ``act_width`` constraints; 8 in the latency layout on 8 devices, else 1)."""
    return _act_shards(config, frame_hw, num_devices, (2, 3))


def vae_batch_shards(config, num_devices: int | None = None) -> int:
    """Devices the games of a decoded batch are split over (``act_batch``: the data-parallel size in
    generate's batch layout, else 1)."""
    return _act_shards(config, (1, 1), num_devices, (0,))


def _act_shards(config, frame_hw: tuple[int, int], num_devices: int | None, dims: tuple[int, ...]) -> int:
    """Product of the mesh axes the VAE activation ``[B, T, h, w, C]``'s ``dims`` are sharded over."""
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
    for entry in (spec[d] for d in dims):
        for a in ((entry,) if isinstance(entry, str) else (entry or ())):
            out *= sizes[a]
    return out


def vae_decoder(g_vae, vcfg, config, num_devices: int | None = None, device=None, resident_bytes: float = 0.0):
    """Play's VAE stage: ``(decode, decode_chunk, decode_plan)``.

    ``decode(p, latents [B, t, C, h, w] scaled) -> frames [B, T, 8h, 8w, 3]`` in [0, 1] with
    ``p["vae"]`` the VAE state: ``VAE_dec(latents / scaling_factor)``, tiled and chunked as
    ``vae_tiling.resolve_decode_tiling`` decides (``vae.tile_size`` -1: from the device's memory
    and the frame's shards on the mesh, :func:`vae_spatial_shards`). Untiled, ``decode_chunk(p,
    latents_chunk, cache) -> (frames, cache)`` runs one chunk of ``decode_plan`` (streaming);
    tiled, both are None / (). ``decode.why`` says what was chosen. ``num_devices``: the mesh's
    device count (default ``jax.device_count()``); ``device``: one device of that mesh, whose memory
    (or chip HBM, for compile-only devices) sets the tile budget (default ``jax.devices()[0]``). Used
    by turn_model.py ``RealTurnModel`` and the ahead-of-time programs (animegamer_jax/aot), which pass
    ``resident_bytes`` (the turn's other weights per device) for compile-only devices.
    """
    scale = float(config.vae.scaling_factor)
    t, h, w = int(config.dit.num_latent_frames), int(config.dit.sample_height), int(config.dit.sample_width)
    sf = vcfg.spatial_factor
    shards = vae_spatial_shards(config, (sf * h, sf * w), num_devices)
    tile, plan, why = resolve_decode_tiling(vcfg, (t, h, w), shards=shards, device=device,
                                            resident_bytes=resident_bytes)
    # the plan is sized for ONE game per device; more rows per device than fit at once decode one
    # game per device at a time (lax.map), so the batch's memory is one game's (web --max_batch,
    # generate --max_batch, animegamer-aot --games_per_chip)
    one = vae_tiling.decode_memory_bytes(vcfg, (min(tile or h, h), min(tile or w, w)), plan, shards,
                                         vae_tiling.decode_bytes_factor(device, tiled=tile > 0))
    # a configured tile (vae.tile_size >= 0) is the user's choice: the batch decodes at once
    budget = vae_tiling.device_decode_budget(vcfg, device, resident_bytes)[0] if vcfg.tile_size < 0 else None
    fit_rows = sys.maxsize if budget is None or one <= 0 else max(1, int(budget // one))
    batch_shards = vae_batch_shards(config, num_devices)
    logging.getLogger(__name__).info("VAE decode: %s; at most %d game(s) per device at once", why, fit_rows)

    def decode(p, latents):
        def run(z):
            vae = nnx.merge(g_vae, p["vae"])
            return vae.tiled_decode(z, tile_size=tile, plan=plan) if tile > 0 else vae.decode(z, plan)

        video = _rows_at_a_time(run, fit_rows, batch_shards)(latents / scale)
        return _to_unit_frames(video, latents.shape)

    decode.why = why
    if tile > 0:
        return decode, None, ()

    def decode_chunk(p, latents, cache):
        # one step of CogVideoXVAE.decode's chunk loop (run_chunked), same plan and caches
        def run(z, c):
            vae = nnx.merge(g_vae, p["vae"])
            return vae.decoder(jnp.moveaxis(z, 2, -1).astype(jnp.dtype(vae.cfg.dtype)), c)

        video, cache = _rows_at_a_time(run, fit_rows, batch_shards)(latents / scale, cache)
        return _to_unit_frames(video.astype(jnp.float32), latents.shape), cache

    return decode, decode_chunk, tuple(plan)


def _rows_at_a_time(fn, fit_rows: int, batch_shards: int):
    """``fn`` over batch-first pytrees, as is when each device holds at most ``fit_rows`` of the
    batch's rows, else one row per device at a time: ``[B, ...]`` -> ``[B / n, n, ...]`` with
    ``n = batch_shards`` (the devices the batch is split over), ``lax.map`` over the first axis, and
    back to ``[B, ...]``. Each mapped step is the one-game-per-device program, so a game's frames do
    not depend on how many games were decoded with it."""

    def run(*args):
        leaves = jax.tree.leaves(args)
        b = leaves[0].shape[0]
        n = batch_shards if b % batch_shards == 0 else 1
        r = b // n
        if r <= fit_rows:
            return fn(*args)

        def split(x):  # [B, ...] -> [r, n, ...]: row j of device i is x[i * r + j]
            return jnp.moveaxis(x.reshape((n, r) + x.shape[1:]), 1, 0)

        def join(y):
            return jnp.moveaxis(y, 0, 1).reshape((n * r,) + y.shape[2:])

        out = jax.lax.map(lambda a: fn(*a), jax.tree.map(split, args))
        return jax.tree.map(join, out)

    return run


def _to_unit_frames(video: jax.Array, latent_shape: tuple[int, ...]) -> jax.Array:
    """VAE output in [-1, 1] -> float32 [B, T, h, w, 3] in [0, 1] (docs/diffusion.md#latent-scale,
    ``media.to_unit``), accepting [B, T, h, w, 3] or the channels-first [B, 3, T, h, w] /
    [B, T, 3, h, w] layouts."""
    v = video.astype(jnp.float32)
    if v.ndim == 5 and v.shape[-1] != 3:
        v = jnp.moveaxis(v, 1 if v.shape[1] == 3 else 2, -1)
    return media.to_unit(v, media.VAE_RANGE)
