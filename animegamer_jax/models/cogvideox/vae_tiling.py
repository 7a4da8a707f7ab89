"""Chunk plans, spatial tiling and device-memory budgeting of the CogVideoX VAE's decode (docs/vae.md).

The network (models/cogvideox/vae.py) runs its causal encoder and decoder over time chunks with
:func:`run_chunked` and decodes large latent planes in tiles with :func:`tiled_apply`; this module
plans both:

  * Chunk plans: sizes of the time chunks (:func:`chunk_plan`; the release's decode plan (3, 2, 2, ...),
    docs/vae.md#chunked-decoding; diffusers' framewise plan). GroupNorm / SpatialNorm statistics are per
    chunk, so the plan changes the numbers.
  * Tiling: equal latent tiles, evenly spread, blended by a normalised linear cross-fade (every output
    pixel a convex mix of tiles). Not diffusers' ``tiled_decode`` (ragged tiles, crop-and-blend);
    neither reproduces the untiled decode (per-tile GroupNorm statistics).
  * Memory: :func:`decode_memory_bytes` estimates one chunk's decode temporaries (the scan carries only
    the causal cache, so the clip's frame count does not enter); ``vae.tile_size = -1`` picks the
    largest decode that fits the device (:func:`resolve_decode_tiling`). The estimate's factors are
    calibrated on XLA:CPU compiled memory (``python -m benchmarks.vae_bench --full_memory``; figures in
    docs/results.md).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import numpy as np

from animegamer_jax.parallel import target as target_lib

Array = jax.Array
Cache = dict[str, Any]


class DecodeConfig(Protocol):
    """The fields of ``models.cogvideox.vae.VAEConfig`` that decode planning reads."""

    block_out_channels: tuple[int, ...]
    temporal_compression_ratio: int
    decode_chunks: tuple[int, int]
    tile_size: int
    decode_memory_gib: float
    dtype: str

    @property
    def spatial_factor(self) -> int: ...


# ----------------------------------------------------------------------------------------------
# Chunk plans
# ----------------------------------------------------------------------------------------------


def chunk_plan(num_frames: int, first: int, step: int) -> tuple[int, ...]:
    """Chunk sizes along time: ``first`` frames, then ``step`` frames per chunk.

    ``first <= 0`` or ``step <= 0`` gives one chunk (the whole clip). The last chunk may be shorter.

    Returns:
      A tuple of positive sizes summing to ``num_frames``.
    """
    if num_frames <= 0:
        raise ValueError(f"chunk_plan: num_frames must be positive, got {num_frames}")
    if first <= 0 or step <= 0:
        return (num_frames,)
    sizes = [min(first, num_frames)]
    left = num_frames - sizes[0]
    while left > 0:
        sizes.append(min(step, left))
        left -= sizes[-1]
    return tuple(sizes)


def diffusers_plan(num_frames: int, batch: int) -> tuple[int, ...]:
    """diffusers' framewise plan (``_encode`` with batch 8, ``_decode`` with batch 2).

    ``max(T // batch, 1)`` chunks; the first takes the ``T % batch`` leftover frames too.
    For 5 latents and batch 2 this is (3, 2), the SAT release plan (docs/vae.md#chunked-decoding).
    """
    n = max(num_frames // batch, 1)
    if n == 1:
        return (num_frames,)
    rem = num_frames % batch
    return (batch + rem,) + (batch,) * (n - 1)


def release_decode_plan(num_latent_frames: int) -> tuple[int, ...]:
    """The SAT sampling script's decode plan: latents [0:3], then pairs (``loop_num = (t-1)//2``, t latent frames)."""
    return chunk_plan(num_latent_frames, 3, 2)


def _check_plan(plan: Sequence[int], num_frames: int) -> tuple[int, ...]:
    plan = tuple(int(p) for p in plan)
    if any(p <= 0 for p in plan) or sum(plan) != num_frames:
        raise ValueError(f"chunk plan {plan} does not split {num_frames} frames into positive chunks")
    return plan


def run_chunked(
    fn: Callable[[Array, Cache | None], tuple[Array, Cache]], x: Array, plan: Sequence[int]
) -> Array:
    """Runs a causal network over time chunks, carrying its cache through ``jax.lax.scan``.

    The first chunk runs with ``cache=None`` (first-frame replication); each later run of
    equal-size chunks is one ``lax.scan`` whose carry is the cache pytree, so only one chunk's
    activations are live at a time.

    Args:
      fn: ``(x_chunk [B, n, ...], cache) -> (y_chunk [B, n', ...], cache)`` (n a chunk's frames).
      x: ``[B, T, ...]``.
      plan: chunk sizes along axis 1, summing to T.

    Returns:
      The outputs concatenated along axis 1.
    """
    plan = _check_plan(plan, x.shape[1])
    y, cache = fn(x[:, : plan[0]], None)
    outs = [y]
    start = plan[0]
    i = 1
    while i < len(plan):
        size = plan[i]
        count = 1
        while i + count < len(plan) and plan[i + count] == size:
            count += 1
        xs = x[:, start : start + size * count]
        xs = xs.reshape((x.shape[0], count, size) + x.shape[2:]).swapaxes(0, 1)

        def body(c, xc):
            yc, c = fn(xc, c)
            return c, yc

        cache, ys = jax.lax.scan(body, cache, xs)
        ys = ys.swapaxes(0, 1)
        outs.append(ys.reshape((ys.shape[0], count * ys.shape[2]) + ys.shape[3:]))
        start += size * count
        i += count
    return jnp.concatenate(outs, axis=1) if len(outs) > 1 else outs[0]


# ----------------------------------------------------------------------------------------------
# Spatial tiles
# ----------------------------------------------------------------------------------------------


def tile_layout(n: int, tile: int, overlap: float) -> tuple[int, list[int]]:
    """Tile starts along one latent axis: equal tiles of ``min(tile, n)`` px, the last ending at ``n``.

    Neighbouring tiles overlap by at least ``tile * overlap`` latent px (starts spread evenly).

    Returns:
      (tile length, sorted start offsets).
    """
    if tile >= n:
        return n, [0]
    stride = max(1, int(tile * (1.0 - overlap)))
    k = -(-(n - tile) // stride) + 1
    return tile, [round(i * (n - tile) / (k - 1)) for i in range(k)]


def tile_weights(length: int, starts: list[int], ramp: int) -> np.ndarray:
    """Blend windows ``[num_tiles, length]``: linear ramps of ``ramp`` px on the sides that overlap a
    neighbour (no ramp at the image border), so overlapping tiles cross-fade."""
    x = np.arange(length, dtype=np.float64) + 0.5
    out = []
    for i in range(len(starts)):
        w = np.ones(length)
        if ramp > 0 and i > 0:
            w = np.minimum(w, x / ramp)
        if ramp > 0 and i < len(starts) - 1:
            w = np.minimum(w, (length - x) / ramp)
        out.append(w)
    return np.stack(out).astype(np.float32)

def tiled_apply(
    decode_fn: Callable[[Array], Array], latents: Array, tile: tuple[int, int], overlap: float, sf: int
) -> Array:
    """Core of :meth:`CogVideoXVAE.tiled_decode` (any tile decoder with spatial factor ``sf``)."""
    b, t_lat, c, h, w = latents.shape
    th, starts_h = tile_layout(h, tile[0], overlap)
    tw, starts_w = tile_layout(w, tile[1], overlap)
    wh = tile_weights(th * sf, starts_h, int(th * sf * overlap))
    ww = tile_weights(tw * sf, starts_w, int(tw * sf * overlap))
    grid = [(i, j) for i in range(len(starts_h)) for j in range(len(starts_w))]
    ys = jnp.asarray([starts_h[i] for i, _ in grid], jnp.int32)
    xs = jnp.asarray([starts_w[j] for _, j in grid], jnp.int32)
    wts = jnp.asarray(np.stack([np.outer(wh[i], ww[j]) for i, j in grid]))
    out_shape = jax.eval_shape(decode_fn, jax.ShapeDtypeStruct((b, t_lat, c, th, tw), latents.dtype))
    t_out, ch = out_shape.shape[1], out_shape.shape[-1]
    acc = jnp.zeros((b, t_out, h * sf, w * sf, ch), jnp.float32)
    wsum = jnp.zeros((h * sf, w * sf), jnp.float32)

    def body(carry, inp):
        acc, wsum = carry
        y0, x0, wt = inp
        zt = jax.lax.dynamic_slice(latents, (0, 0, 0, y0, x0), (b, t_lat, c, th, tw))
        dec = decode_fn(zt).astype(jnp.float32) * wt[None, None, :, :, None]
        oy, ox = y0 * sf, x0 * sf
        cur = jax.lax.dynamic_slice(acc, (0, 0, oy, ox, 0), dec.shape)
        acc = jax.lax.dynamic_update_slice(acc, cur + dec, (0, 0, oy, ox, 0))
        cw = jax.lax.dynamic_slice(wsum, (oy, ox), wt.shape)
        wsum = jax.lax.dynamic_update_slice(wsum, cw + wt, (oy, ox))
        return (acc, wsum), None

    (acc, wsum), _ = jax.lax.scan(body, (acc, wsum), (ys, xs, wts))
    return acc / wsum[None, None, :, :, None]


# ----------------------------------------------------------------------------------------------
# Decode memory: automatic tile and chunk choice
# ----------------------------------------------------------------------------------------------

#: bytes of decode temporaries per (output pixel x output frame of the largest chunk x channel of the
#: top level x byte of the activation dtype): the compiled temporaries of the full-size bf16 decode
#: (XLA:CPU, nothing run; ``python -m benchmarks.vae_bench --full_memory``, untiled and tiled) divided
#: by that product, rounded up
DECODE_BYTES_FACTOR = 120.0
#: the same factor for TPU tiles, GPU decodes and the untiled TPU decode: each the compiled
#: temporaries of the paper-size ``vae_decode`` program (``python -m animegamer_jax.commands.aot
#: --topology=v6e-1|h200-1 --program=vae_decode``) over the product above, rounded up; the
#: measurements are in docs/results.md "VAE decode bytes" (calibration table)
TPU_DECODE_BYTES_FACTOR = 30.0
GPU_DECODE_BYTES_FACTOR = 30.0
TPU_UNTILED_DECODE_BYTES_FACTOR = 20.0
#: per-device factor of a decode whose frames are sharded over devices (halo exchange, replicated
#: small tensors), from the compiled latency layout on 8 devices against the unsharded decode / 8
SHARDED_DECODE_OVERHEAD = 1.25
#: auto tiling's budget, in units of 2**30 bytes, when the device reports no memory limit (XLA:CPU): the
#: project's per-device target for the full-size decode, checked with
#: ``python -m animegamer_jax.commands.aot --topology=cpu-1 --program=vae_decode``
CPU_DECODE_BUDGET_GIB = 16.0
#: fraction of a device's free memory (``bytes_limit - bytes_in_use``) auto tiling may plan for
DEVICE_BUDGET_FRACTION = 0.8


def _chunk_frames(plan: Sequence[int], ratio: int) -> int:
    """Output frames of the largest chunk: the first chunk of s latents gives 1 + r (s - 1), later ones r s."""
    return max([1 + ratio * (plan[0] - 1)] + [ratio * s for s in plan[1:]])


def decode_bytes_factor(device: Any = None, tiled: bool = True) -> float:
    """:data:`TPU_DECODE_BYTES_FACTOR` for a TPU ``device`` (``tiled=False``: the untiled decode's
    :data:`TPU_UNTILED_DECODE_BYTES_FACTOR`), :data:`GPU_DECODE_BYTES_FACTOR` for a GPU (platform
    ``gpu`` / ``cuda`` / ``rocm``; compile-only devices too), else :data:`DECODE_BYTES_FACTOR`
    (XLA:CPU's calibration)."""
    device = jax.devices()[0] if device is None else device
    platform = getattr(device, "platform", "")
    if platform == "tpu":
        return TPU_DECODE_BYTES_FACTOR if tiled else TPU_UNTILED_DECODE_BYTES_FACTOR
    return GPU_DECODE_BYTES_FACTOR if platform in ("gpu", "cuda", "rocm") else DECODE_BYTES_FACTOR


def decode_memory_bytes(cfg: DecodeConfig, tile: tuple[int, int], plan: Sequence[int], shards: int = 1,
                        factor: float = DECODE_BYTES_FACTOR) -> float:
    """Estimated per-device temporaries of decoding one ``tile`` (latent h, w) with a chunk ``plan``.

    ``factor`` (:func:`decode_bytes_factor`; default ``DECODE_BYTES_FACTOR``) ``x itemsize x block_out_channels[0] x (sf h)(sf w) x frames of the largest
    chunk``, divided by ``shards`` devices holding parts of each frame (times
    ``SHARDED_DECODE_OVERHEAD`` when > 1). Decode memory is one chunk's activations (the scan
    carries only the causal cache), so the frame count of the clip does not enter.
    """
    sf = cfg.spatial_factor
    px = (sf * int(tile[0])) * (sf * int(tile[1]))
    frames = _chunk_frames(tuple(plan), cfg.temporal_compression_ratio)
    est = factor * jnp.dtype(cfg.dtype).itemsize * cfg.block_out_channels[0] * px * frames
    return est / shards * (SHARDED_DECODE_OVERHEAD if shards > 1 else 1.0)


def device_decode_budget(cfg: DecodeConfig, device: Any = None, resident_bytes: float = 0.0) -> tuple[float, str]:
    """(bytes, where from) that auto tiling may plan for on ``device`` (default ``jax.devices()[0]``;
    a compile-only device of another chip when compiling for it ahead of time).

    ``cfg.decode_memory_gib`` > 0 wins; else ``DEVICE_BUDGET_FRACTION`` of the device's free memory
    from ``memory_stats()`` (``bytes_limit - bytes_in_use``, GPU/TPU: play builds the decoder with
    every stage's weights already on the device); else (compile-only devices have no stats) of its
    chip's HBM (``parallel.target.CHIPS``) less ``resident_bytes`` (the ahead-of-time tool passes the
    turn's other weights, so it decides as play on that chip would); else (XLA:CPU reports no limit)
    ``CPU_DECODE_BUDGET_GIB``.
    """
    if cfg.decode_memory_gib > 0:
        return cfg.decode_memory_gib * 2**30, "vae.decode_memory_gib"
    device = jax.devices()[0] if device is None else device
    try:
        stats = device.memory_stats() or {}
    except Exception:  # compile-only devices and some backends raise instead of returning None
        stats = {}
    limit = stats.get("bytes_limit")
    if limit:
        free = float(limit) - float(stats.get("bytes_in_use", 0))
        return DEVICE_BUDGET_FRACTION * free, f"{device.device_kind} memory_stats"
    chip = target_lib.of_device(device).chip
    if chip is not None:
        less = f" less {resident_bytes / 2**30:.1f} GiB of weights" if resident_bytes else ""
        return (DEVICE_BUDGET_FRACTION * (chip.hbm_bytes - resident_bytes),
                f"{device.device_kind} HBM {chip.hbm_bytes / 2**30:.0f} GiB{less}")
    return CPU_DECODE_BUDGET_GIB * 2**30, f"fallback {CPU_DECODE_BUDGET_GIB:g} GiB ({device.platform})"


def tiled_work(h: int, w: int, tile: int, overlap: float) -> int:
    """Latent px decoded by a ``tile`` layout of an ``h x w`` plane (overlaps counted each time)."""
    th, sh = tile_layout(h, tile, overlap)
    tw, sw = tile_layout(w, tile, overlap)
    return th * len(sh) * tw * len(sw)


def pick_decode_tiling(cfg: DecodeConfig, latent_shape: Sequence[int], budget_bytes: float,
                       shards: int = 1, factor: float = DECODE_BYTES_FACTOR,
                       untiled_factor: float | None = None) -> tuple[int, tuple[int, ...]]:
    """The cheapest decode of ``latent_shape`` (t, h, w) whose :func:`decode_memory_bytes` fits.

    Tried in order, first fit wins: with the release chunk plan (``cfg.decode_chunks``), untiled;
    then, of the square tiles from ``max(h, w)`` down to 8 latent px (clipped to the plane, 2 px
    steps) that fit, the one decoding the fewest latent px (:func:`tiled_work` with
    ``cfg.tile_overlap``; ties: the larger tile); then the same with 1-latent time chunks (diffusers'
    tiled decode likewise decodes each tile in small time chunks with carried caches). Nothing fits:
    8 px tiles with 1-latent chunks.

    ``factor``: :func:`decode_memory_bytes`'s bytes factor for tiles; ``untiled_factor`` for the
    untiled decode (default ``factor``).

    Returns:
      (tile size in latent px, 0 = untiled; chunk plan).
    """
    t, h, w = (int(v) for v in latent_shape)
    untiled_factor = factor if untiled_factor is None else untiled_factor
    plans = [chunk_plan(t, *cfg.decode_chunks)]
    if plans[0] != chunk_plan(t, 1, 1):
        plans.append(chunk_plan(t, 1, 1))
    for plan in plans:
        if decode_memory_bytes(cfg, (h, w), plan, shards, untiled_factor) <= budget_bytes:
            return 0, plan
        fits = [tile for tile in range(max(h, w), 7, -2) if not (tile >= h and tile >= w)
                and decode_memory_bytes(cfg, (min(tile, h), min(tile, w)), plan, shards, factor) <= budget_bytes]
        if fits:
            return min(fits, key=lambda tile: (tiled_work(h, w, tile, cfg.tile_overlap), -tile)), plan
    return 8, plans[-1]


def resolve_decode_tiling(cfg: DecodeConfig, latent_shape: Sequence[int], shards: int = 1,
                          device: Any = None, resident_bytes: float = 0.0) -> tuple[int, tuple[int, ...], str]:
    """(tile, plan, why) for ``cfg``: ``tile_size >= 0`` as configured with the release plan;
    ``-1`` from :func:`pick_decode_tiling` under :func:`device_decode_budget` (``resident_bytes``:
    see there) with the device's :func:`decode_bytes_factor`; ``why`` says which (for logs)."""
    t, h, w = (int(v) for v in latent_shape)
    release = chunk_plan(t, *cfg.decode_chunks)
    if cfg.tile_size >= 0:
        return cfg.tile_size, release, f"vae.tile_size={cfg.tile_size}"
    budget, src = device_decode_budget(cfg, device, resident_bytes)
    factor = decode_bytes_factor(device)
    untiled = decode_bytes_factor(device, tiled=False)
    tile, plan = pick_decode_tiling(cfg, latent_shape, budget, shards, factor, untiled)
    est = decode_memory_bytes(cfg, (min(tile or h, h), min(tile or w, w)), plan, shards, untiled if not tile else factor)
    return tile, plan, (f"auto: {'untiled' if not tile else f'tile {tile}'}, chunks {plan}, estimated "
                        f"{est / 2**30:.1f} GiB of a {budget / 2**30:.1f} GiB budget ({src}, {shards} shard(s))")
