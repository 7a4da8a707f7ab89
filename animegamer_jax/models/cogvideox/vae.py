"""CogVideoX 3-D causal VAE (encoder + decoder) in Flax NNX.

Follows the CogVideoX-2B SAT VAE (`vae_modules/cp_enc_dec.py`, paper §3.2 "3D-VAE from [77]") and
its diffusers port `AutoencoderKLCogVideoX` (diffusers 0.42 `autoencoder_kl_cogvideox.py`); facts in
docs/vae.md. Submodule and parameter names mirror the diffusers names so that the checkpoint
map (animegamer_jax/models/cogvideox/vae_convert.py) is a short, mechanical table.

Layouts:
  * Inside, every activation is channels-last ``[B, T, h, w, C]`` (shapes:
    docs/design.md#dimension-letters).
  * Public video: ``[B, T, 8h, 8w, 3]`` float in [-1, 1] (T = 1 + 4k for the causal VAE).
  * Public latents: ``[B, t, C, h, w]`` (the DiT's layout, docs/vae.md#configuration),
    t = 1 + (T - 1) / 4 and the spatial factor 8 at the paper config.

Not obvious from the reference:
  * Causal caches are explicit. Every 3x3x3 causal conv takes ``cache`` (the last ``kt - 1 = 2``
    frames of its time-padded input from the previous chunk, or None = replicate the first frame) and
    returns the new one; the whole network's cache is a nested dict pytree carried through a
    ``jax.lax.scan`` over equal-size chunks. No hidden mutable state.
  * GroupNorm / SpatialNorm statistics are per chunk (as in SAT and diffusers), so the chunk plan
    changes the numbers; ``decode`` takes the plan explicitly. The release decodes latents [0:3]
    then [3:5] (docs/vae.md#chunked-decoding), which is also diffusers' plan for an odd latent count.
  * Odd-frame rule: with odd T > 1 the first frame is special in temporal down/upsampling and in
    the SpatialNorm latent resize (frame 0 resized alone, the rest together).
  * The decoder's resnet and output norms are SpatialNorm3D with eps 1e-6 hard-coded (diffusers),
    the encoder's resnet GroupNorms use ``norm_eps`` and its ``norm_out`` uses 1e-6.
  * Memory: decode memory is one chunk's activations (the scan carries only the cache), so it does
    not grow with the frame count. Chunk plans, spatial tiling and the automatic tile choice from
    the device's memory (``tile_size = -1``) live in models/cogvideox/vae_tiling.py.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from animegamer_jax.models.cogvideox.vae_tiling import (
    Array,
    Cache,
    chunk_plan,
    resolve_decode_tiling,
    run_chunked,
    tiled_apply,
)

from animegamer_jax.parallel import constrain

#: ``VAEConfig.conv_impl`` values
CONV_IMPLS = ("as_2d", "3d")

_ACT_AXES = ("act_batch", "act_frames", "act_height", "act_width", "act_channels")


@dataclasses.dataclass(frozen=True)
class VAEConfig:
    """Hyper-parameters of the CogVideoX VAE (docs/vae.md#configuration, docs/vae.md#checkpoint-keys diffusers config).

    Attributes:
      in_channels: video channels (3, RGB).
      out_channels: decoded channels (3).
      latent_channels: latent channels C (16).
      block_out_channels: channels per level (128, 256, 256, 512); spatial factor 2**(levels-1).
      layers_per_block: encoder resnets per level (decoder uses layers_per_block + 1).
      norm_num_groups: GroupNorm groups (32).
      norm_eps: encoder resnet GroupNorm eps (1e-6).
      temporal_compression_ratio: 4 (log2 = number of levels that also compress time).
      scaling_factor: latent scale 1.15258426 (docs/diffusion.md#latent-scale).
      decode_chunks: (first, step): latent frames in the first decode chunk, then per chunk.
      encode_chunks: (first, step) for encoding; (0, 0) encodes the whole clip at once (SAT
        training); (8, 8) is diffusers' framewise encoding.
      tile_size: spatial tile in latent pixels for tiled decode; 0 = untiled; -1 = auto: the
        largest decode (untiled, else the largest tile, else 1-latent time chunks) whose estimated
        memory fits the device (``vae_tiling.pick_decode_tiling``).
      tile_overlap: overlap fraction between neighbouring tiles.
      decode_memory_gib: auto tiling's memory budget per device, in units of 2**30 bytes; 0 = from
        the device (``vae_tiling.device_decode_budget``: ``DEVICE_BUDGET_FRACTION`` of the free bytes
        of ``memory_stats()``, ``CPU_DECODE_BUDGET_GIB`` on CPU).
      encoder_in_channels: width of the encoder's ``conv_in`` (SAT ``ch``); 0 = ``block_out_channels[0]``
        (SAT ``ch * ch_mult[0]``, equal at paper size where ``ch_mult[0] = 1``).
      dtype: activation dtype name ("float32", "bfloat16"); parameters stay float32.
      conv_impl: how the 3x3x3 causal convs are built: "as_2d" (the ``kt`` time taps unfolded into
        the channels of one 2-D conv, :func:`conv3d_as_2d`; fast on XLA:CPU, which has no fast 3-D
        conv, but the unfolded input is ``kt`` times the activation's bytes) or "3d" (one native
        ``conv_general_dilated`` over NDHWC, :func:`conv3d_native`; no unfolded copy, but on v6e
        the compiler adds relayout copies and it moves more bytes: docs/results.md#dit-and-vae-decode-bytes), and the decoder's SpatialNorm convs at the latent resolution
        (:class:`SpatialNorm3D`). Same result up to float summation order (docs/vae.md#building-blocks).
    """

    in_channels: int = 3
    out_channels: int = 3
    latent_channels: int = 16
    block_out_channels: tuple[int, ...] = (128, 256, 256, 512)
    layers_per_block: int = 3
    norm_num_groups: int = 32
    norm_eps: float = 1e-6
    temporal_compression_ratio: int = 4
    scaling_factor: float = 1.15258426
    decode_chunks: tuple[int, int] = (3, 2)
    encode_chunks: tuple[int, int] = (0, 0)
    tile_size: int = 0
    tile_overlap: float = 0.25
    decode_memory_gib: float = 0.0
    encoder_in_channels: int = 0
    dtype: str = "float32"
    conv_impl: str = "as_2d"

    @classmethod
    def from_config(cls, cfg: Any) -> "VAEConfig":
        """Builds from the ``vae`` ConfigDict section (configs/*.py); unknown fields are ignored."""
        names = {f.name for f in dataclasses.fields(cls)}
        kw = {k: cfg[k] for k in cfg.keys() if k in names}
        for k in ("block_out_channels", "decode_chunks", "encode_chunks"):
            if k in kw:
                kw[k] = tuple(int(v) for v in kw[k])
        if kw.get("conv_impl", "as_2d") not in CONV_IMPLS:
            raise ValueError(f"vae.conv_impl={kw['conv_impl']!r}: use one of {', '.join(CONV_IMPLS)}")
        return cls(**kw)

    @property
    def spatial_factor(self) -> int:
        return 2 ** (len(self.block_out_channels) - 1)

    @property
    def temporal_levels(self) -> int:
        return int(math.log2(self.temporal_compression_ratio))


# ----------------------------------------------------------------------------------------------
# Layers
# ----------------------------------------------------------------------------------------------


def _uniform_fan_in(fan_in: int) -> Callable:
    """PyTorch's default conv init (kaiming-uniform a=sqrt(5) == U(-1/sqrt(fan_in), 1/sqrt(fan_in)))."""
    bound = 1.0 / math.sqrt(fan_in)

    def init(key, shape, dtype=jnp.float32):
        return jax.random.uniform(key, shape, dtype, -bound, bound)

    return init


class Conv3d(nnx.Module):
    """Plain 3-D convolution, stride 1, zero spatial padding ``pad``, no time padding.

    Params: ``kernel`` [kt, kh, kw, C_in, C_out] (logical ``conv_in``/``conv_out``), ``bias`` [C_out].
    Input ``[B, T, h, w, C_in]`` -> ``[B, T - kt + 1, h + 2 pad - kh + 1, ..., C_out]``.
    """

    def __init__(self, cin: int, cout: int, kernel: tuple[int, int, int], pad: int, *, dtype, rngs: nnx.Rngs):
        fan_in = cin * int(np.prod(kernel))
        init = _uniform_fan_in(fan_in)
        self.kernel = nnx.Param(
            nnx.with_partitioning(init, (None, None, None, "conv_in", "conv_out"))(rngs.params(), (*kernel, cin, cout))
        )
        self.bias = nnx.Param(nnx.with_partitioning(init, ("conv_out",))(rngs.params(), (cout,)))
        self.pad = pad
        self.dtype = dtype
        self.impl = "as_2d"  # set for the whole network from VAEConfig.conv_impl (_set_conv_impl)

    def __call__(self, x: Array) -> Array:
        conv = conv3d_native if self.impl == "3d" else conv3d_as_2d
        y = conv(x.astype(self.dtype), self.kernel[...].astype(self.dtype), self.pad)
        return y + self.bias[...].astype(self.dtype)


def conv3d_native(x: Array, kernel: Array, pad: int) -> Array:
    """:func:`conv3d_as_2d`'s contract as one native 3-D ``conv_general_dilated`` (NDHWC, DHWIO).

    Reads the input once (the 2-D form materialises ``kt`` shifted copies of it); 1x1x1 kernels
    go through :func:`conv3d_as_2d` (a plain per-pixel matmul either way).
    """
    if kernel.shape[0] == 1:
        return conv3d_as_2d(x, kernel, pad)
    return jax.lax.conv_general_dilated(x, kernel, window_strides=(1, 1, 1),
                                        padding=((0, 0), (pad, pad), (pad, pad)),
                                        dimension_numbers=("NDHWC", "DHWIO", "NDHWC"))


def conv3d_as_2d(x: Array, kernel: Array, pad: int) -> Array:
    """Stride-1 3-D convolution, valid in time, zero padded by ``pad`` in space, as ONE 2-D conv.

    The ``kt`` time taps are unfolded into channels (``x[:, i : i + T']`` for each tap, concatenated
    on the last axis) and the kernel ``[kt, kh, kw, C_in, C_out]`` is reshaped to
    ``[kh, kw, kt C_in, C_out]`` to match, with time folded into the batch. Same result as
    ``conv_general_dilated`` over NDHWC up to float summation order; XLA:CPU has no fast 3-D conv
    (``python -m benchmarks.vae_bench --train_step`` times the tiny VAE's train step both ways).

    Args:
      x: ``[B, T, h, w, C_in]``.
      kernel: ``[kt, kh, kw, C_in, C_out]`` (same dtype as x).
      pad: spatial zero padding on each side.

    Returns:
      ``[B, T - kt + 1, h + 2 pad - kh + 1, w + 2 pad - kw + 1, C_out]``.
    """
    kt, kh, kw, cin, cout = kernel.shape
    b, t = x.shape[:2]
    t_out = t - kt + 1
    xs = x if kt == 1 else jnp.concatenate([x[:, i : i + t_out] for i in range(kt)], axis=-1)
    xs = xs.reshape((b * t_out,) + xs.shape[2:])
    k2 = jnp.transpose(kernel, (1, 2, 0, 3, 4)).reshape(kh, kw, kt * cin, cout)
    y = jax.lax.conv_general_dilated(xs, k2, window_strides=(1, 1), padding=((pad, pad), (pad, pad)),
                                     dimension_numbers=("NHWC", "HWIO", "NHWC"))
    return y.reshape((b, t_out) + y.shape[1:])


class Conv2d(nnx.Module):
    """Per-frame 2-D convolution (``[B, T, h, w, C]``), kernel [kh, kw, C_in, C_out]."""

    def __init__(self, cin: int, cout: int, k: int, stride: int, pad: int, *, dtype, rngs: nnx.Rngs):
        init = _uniform_fan_in(cin * k * k)
        self.kernel = nnx.Param(
            nnx.with_partitioning(init, (None, None, "conv_in", "conv_out"))(rngs.params(), (k, k, cin, cout)))
        self.bias = nnx.Param(nnx.with_partitioning(init, ("conv_out",))(rngs.params(), (cout,)))
        self.stride = stride
        self.pad = pad
        self.dtype = dtype

    def __call__(self, x: Array) -> Array:
        b, t = x.shape[:2]
        x = x.reshape((b * t,) + x.shape[2:]).astype(self.dtype)
        p = self.pad
        y = jax.lax.conv_general_dilated(
            x,
            self.kernel[...].astype(self.dtype),
            window_strides=(self.stride, self.stride),
            padding=((p, p), (p, p)),
            dimension_numbers=("NHWC", "HWIO", "NHWC"),
        )
        y = y + self.bias[...].astype(self.dtype)
        return y.reshape((b, t) + y.shape[1:])


class CausalConv3d(nnx.Module):
    """Causal 3-D conv (``ContextParallelCausalConv3d`` / ``CogVideoXCausalConv3d``), stride 1.

    Time is padded in front with ``kt - 1`` frames: the cached frames of the previous chunk, or
    copies of the first frame when ``cache`` is None; space is zero padded by ``(k - 1) // 2``.
    The new cache is the last ``kt - 1`` frames of the time-padded input (docs/vae.md#building-blocks).
    """

    def __init__(self, cin: int, cout: int, k: int, *, dtype, rngs: nnx.Rngs):
        self.time_kernel = k
        self.conv = Conv3d(cin, cout, (k, k, k), (k - 1) // 2, dtype=dtype, rngs=rngs)

    def __call__(self, x: Array, cache: Array | None = None) -> tuple[Array, Array | None]:
        """x: [B, T, h, w, C]; cache: [B, kt-1, h, w, C] or None -> ([B, T, h, w, C_out], new cache)."""
        kt = self.time_kernel
        if kt == 1:
            return self.conv(x), None
        if cache is None and x.shape[1] == 1:
            # A lone first frame: its kt - 1 replicated pads make every time tap see the same frame,
            # so the taps' kernels sum to one 2-D conv (kt x fewer FLOPs; first-frame training/encode).
            c = self.conv
            k = jnp.sum(c.kernel[...].astype(c.dtype), axis=0, keepdims=True)
            y = conv3d_as_2d(x.astype(c.dtype), k, c.pad) + c.bias[...].astype(c.dtype)  # kt = 1: a 2-D conv
            return y, jnp.repeat(x, kt - 1, axis=1)
        pad = jnp.repeat(x[:, :1], kt - 1, axis=1) if cache is None else cache.astype(x.dtype)
        xp = jnp.concatenate([pad, x], axis=1)
        return self.conv(xp), xp[:, -(kt - 1) :]


class GroupNorm(nnx.Module):
    """GroupNorm over (T, h, w, C / groups) per group, statistics in float32; params ``scale``, ``bias``."""

    def __init__(self, channels: int, groups: int, eps: float, *, dtype):
        if channels % groups:
            raise ValueError(f"GroupNorm: {channels} channels not divisible by {groups} groups")
        ones = nnx.with_partitioning(nnx.initializers.ones_init(), ("norm",))
        zeros = nnx.with_partitioning(nnx.initializers.zeros_init(), ("norm",))
        self.scale = nnx.Param(ones(jax.random.key(0), (channels,)))
        self.bias = nnx.Param(zeros(jax.random.key(0), (channels,)))
        self.groups = groups
        self.eps = eps
        self.dtype = dtype

    def __call__(self, x: Array) -> Array:
        shape = x.shape
        xg = x.astype(jnp.float32).reshape(shape[:-1] + (self.groups, shape[-1] // self.groups))
        axes = tuple(range(1, len(shape) - 1)) + (len(shape),)
        mean = xg.mean(axis=axes, keepdims=True)
        var = jnp.square(xg - mean).mean(axis=axes, keepdims=True)
        y = ((xg - mean) * jax.lax.rsqrt(var + self.eps)).reshape(shape)
        return (y * self.scale[...] + self.bias[...]).astype(self.dtype)


def _nearest_index(n_in: int, n_out: int) -> np.ndarray:
    # PyTorch "nearest": src = floor(dst * in / out).
    return np.minimum(np.floor(np.arange(n_out) * (n_in / n_out)).astype(np.int32), n_in - 1)


def nearest_resize(z: Array, size: tuple[int, int, int]) -> Array:
    """Nearest resize of ``[B, T, h, w, C]`` to (T', h', w') (``F.interpolate(mode="nearest")``)."""
    for axis, n_out in zip((1, 2, 3), size):
        n_in = z.shape[axis]
        if n_in == n_out:
            continue
        if n_out % n_in == 0:
            z = jnp.repeat(z, n_out // n_in, axis=axis)
        else:
            z = jnp.take(z, jnp.asarray(_nearest_index(n_in, n_out)), axis=axis)
    return z


class SpatialNorm3D(nnx.Module):
    """``GroupNorm(f) * conv_y(zq) + conv_b(zq)`` with zq nearest-resized to f (odd-frame rule).

    ``conv_y``/``conv_b`` are causal 1x1x1 convs (no time cache needed). docs/vae.md#building-blocks.
    With ``at_latent`` (``VAEConfig.conv_impl = "3d"``) they run before the resize, at zq's
    resolution: the same values up to float summation order, 64x fewer conv pixels at the top level.
    """

    def __init__(self, f_channels: int, zq_channels: int, groups: int, *, dtype, rngs: nnx.Rngs):
        self.norm_layer = GroupNorm(f_channels, groups, 1e-6, dtype=dtype)
        self.conv_y = CausalConv3d(zq_channels, f_channels, 1, dtype=dtype, rngs=rngs)
        self.conv_b = CausalConv3d(zq_channels, f_channels, 1, dtype=dtype, rngs=rngs)
        self.at_latent = False  # conv_y / conv_b at zq's resolution; VAEConfig.conv_impl "3d" (_set_conv_impl)

    def __call__(self, f: Array, zq: Array) -> Array:
        size = f.shape[1:4]
        if self.at_latent:
            # conv_y / conv_b are per-pixel (1x1x1), so they commute with the nearest resize: they run
            # at zq's (latent) resolution and only their outputs are resized, a broadcast that XLA fuses
            # into the norm's elementwise tail (no full-resolution zq, y or b in memory)
            y, b = self.conv_y(zq)[0], self.conv_b(zq)[0]
            return self.norm_layer(f) * _resize_odd(y, size) + _resize_odd(b, size)
        zq = _resize_odd(zq, size)
        y, _ = self.conv_y(zq)
        b, _ = self.conv_b(zq)
        return self.norm_layer(f) * y + b


def _resize_odd(z: Array, size: tuple[int, int, int]) -> Array:
    """:func:`nearest_resize` with the odd-frame rule: odd T' > 1 resizes frame 0 alone, the rest together."""
    t, h, w = size
    if t > 1 and t % 2 == 1:
        return jnp.concatenate([nearest_resize(z[:, :1], (1, h, w)), nearest_resize(z[:, 1:], (t - 1, h, w))], axis=1)
    return nearest_resize(z, (t, h, w))


class ResnetBlock3D(nnx.Module):
    """norm1 -> SiLU -> conv1 -> norm2 -> SiLU -> conv2, plus a 1x1x1 ``conv_shortcut`` when C changes."""

    def __init__(self, cin: int, cout: int, groups: int, eps: float, spatial_norm_dim: int | None, *, dtype, rngs):
        if spatial_norm_dim is None:
            self.norm1 = GroupNorm(cin, groups, eps, dtype=dtype)
            self.norm2 = GroupNorm(cout, groups, eps, dtype=dtype)
        else:
            self.norm1 = SpatialNorm3D(cin, spatial_norm_dim, groups, dtype=dtype, rngs=rngs)
            self.norm2 = SpatialNorm3D(cout, spatial_norm_dim, groups, dtype=dtype, rngs=rngs)
        self.conv1 = CausalConv3d(cin, cout, 3, dtype=dtype, rngs=rngs)
        self.conv2 = CausalConv3d(cout, cout, 3, dtype=dtype, rngs=rngs)
        self.conv_shortcut = Conv3d(cin, cout, (1, 1, 1), 0, dtype=dtype, rngs=rngs) if cin != cout else None
        self.spatial = spatial_norm_dim is not None

    def __call__(self, x: Array, zq: Array | None, cache: Cache | None) -> tuple[Array, Cache]:
        cache = cache or {}
        h = self.norm1(x, zq) if self.spatial else self.norm1(x)
        h, c1 = self.conv1(jax.nn.silu(h), cache.get("conv1"))
        h = self.norm2(h, zq) if self.spatial else self.norm2(h)
        h, c2 = self.conv2(jax.nn.silu(h), cache.get("conv2"))
        if self.conv_shortcut is not None:
            x = self.conv_shortcut(x)
        return constrain(h + x.astype(h.dtype), _ACT_AXES), {"conv1": c1, "conv2": c2}


class Downsample3D(nnx.Module):
    """Optional temporal avg-pool (odd T keeps frame 0), then zero pad (right, bottom) + 3x3 stride-2 conv."""

    def __init__(self, ch: int, compress_time: bool, *, dtype, rngs):
        self.conv = Conv2d(ch, ch, 3, 2, 0, dtype=dtype, rngs=rngs)
        self.compress_time = compress_time

    def __call__(self, x: Array) -> Array:
        if self.compress_time:
            t = x.shape[1]
            if t % 2 == 1:
                rest = x[:, 1:]
                if rest.shape[1] > 0:
                    rest = (rest[:, 0::2] + rest[:, 1::2]) * 0.5
                x = jnp.concatenate([x[:, :1], rest], axis=1)
            else:
                x = (x[:, 0::2] + x[:, 1::2]) * 0.5
        x = jnp.pad(x, ((0, 0), (0, 0), (0, 1), (0, 1), (0, 0)))
        return self.conv(x)


class Upsample3D(nnx.Module):
    """Nearest x2 upsampling (time too when ``compress_time``; odd T: frame 0 in space only) + 3x3 conv."""

    def __init__(self, ch: int, compress_time: bool, *, dtype, rngs):
        self.conv = Conv2d(ch, ch, 3, 1, 1, dtype=dtype, rngs=rngs)
        self.compress_time = compress_time

    def __call__(self, x: Array) -> Array:
        up2 = lambda a: jnp.repeat(jnp.repeat(a, 2, axis=2), 2, axis=3)  # noqa: E731
        t = x.shape[1]
        if self.compress_time and t > 1:
            if t % 2 == 1:
                x = jnp.concatenate([up2(x[:, :1]), jnp.repeat(up2(x[:, 1:]), 2, axis=1)], axis=1)
            else:
                x = jnp.repeat(up2(x), 2, axis=1)
        else:
            x = up2(x)
        return self.conv(x)


class _Level(nnx.Module):
    """One encoder down level or decoder up level: ``resnets`` then an optional sampler."""

    def _samplers(self):
        return None

    def run(self, x: Array, zq: Array | None, cache: Cache | None) -> tuple[Array, Cache]:
        cache = cache or {}
        new = {}
        for i, r in enumerate(self.resnets):
            x, new[f"resnet_{i}"] = r(x, zq, cache.get(f"resnet_{i}"))
        samplers = self._samplers()
        if samplers is not None:
            for s in samplers:
                x = s(x)
        return x, new


class DownBlock3D(_Level):
    """diffusers ``CogVideoXDownBlock3D`` (params ``resnets.{i}``, ``downsamplers.0``)."""

    def __init__(self, resnets, downsamplers):
        self.resnets = nnx.List(resnets)
        self.downsamplers = nnx.List(downsamplers) if downsamplers else None

    def _samplers(self):
        return self.downsamplers


class UpBlock3D(_Level):
    """diffusers ``CogVideoXUpBlock3D`` (params ``resnets.{i}``, ``upsamplers.0``)."""

    def __init__(self, resnets, upsamplers):
        self.resnets = nnx.List(resnets)
        self.upsamplers = nnx.List(upsamplers) if upsamplers else None

    def _samplers(self):
        return self.upsamplers


class MidBlock3D(_Level):
    """Two resnets at the lowest resolution (``mid_block.resnets.{0,1}``)."""

    def __init__(self, resnets):
        self.resnets = nnx.List(resnets)


def _set_conv_impl(net: nnx.Module, impl: str) -> None:
    """Applies ``VAEConfig.conv_impl`` to ``net``: ``impl`` on every :class:`Conv3d`; with "3d" also
    every :class:`SpatialNorm3D` runs its convs at the latent resolution."""
    for _, m in net.iter_modules():
        if isinstance(m, Conv3d):
            m.impl = impl
        elif isinstance(m, SpatialNorm3D):
            m.at_latent = impl == "3d"


class Encoder3D(nnx.Module):
    """``conv_in`` -> down levels -> mid -> GroupNorm -> SiLU -> ``conv_out`` (2 x latent channels)."""

    def __init__(self, cfg: VAEConfig, *, rngs: nnx.Rngs):
        dt = jnp.dtype(cfg.dtype)
        boc = cfg.block_out_channels
        g, eps = cfg.norm_num_groups, cfg.norm_eps
        out_ch = cfg.encoder_in_channels or boc[0]
        self.conv_in = CausalConv3d(cfg.in_channels, out_ch, 3, dtype=dt, rngs=rngs)
        blocks = []
        for i, ch in enumerate(boc):
            in_ch, out_ch = out_ch, ch
            resnets = [
                ResnetBlock3D(in_ch if j == 0 else out_ch, out_ch, g, eps, None, dtype=dt, rngs=rngs)
                for j in range(cfg.layers_per_block)
            ]
            down = None
            if i < len(boc) - 1:
                down = [Downsample3D(out_ch, i < cfg.temporal_levels, dtype=dt, rngs=rngs)]
            blocks.append(DownBlock3D(resnets, down))
        self.down_blocks = nnx.List(blocks)
        self.mid_block = MidBlock3D(
            [ResnetBlock3D(boc[-1], boc[-1], g, eps, None, dtype=dt, rngs=rngs) for _ in range(2)])
        self.norm_out = GroupNorm(boc[-1], g, 1e-6, dtype=dt)
        self.conv_out = CausalConv3d(boc[-1], 2 * cfg.latent_channels, 3, dtype=dt, rngs=rngs)
        _set_conv_impl(self, cfg.conv_impl)

    def __call__(self, x: Array, cache: Cache | None = None) -> tuple[Array, Cache]:
        """x: [B, T, 8h, 8w, C_in] -> moments [B, t, h, w, 2 C_lat] and the new cache."""
        cache = cache or {}
        new = {}
        h, new["conv_in"] = self.conv_in(x, cache.get("conv_in"))
        for i, blk in enumerate(self.down_blocks):
            h, new[f"down_block_{i}"] = blk.run(h, None, cache.get(f"down_block_{i}"))
        h, new["mid_block"] = self.mid_block.run(h, None, cache.get("mid_block"))
        h = jax.nn.silu(self.norm_out(h))
        h, new["conv_out"] = self.conv_out(h, cache.get("conv_out"))
        return h, new


class Decoder3D(nnx.Module):
    """``conv_in`` -> mid -> up levels (high to low channels) -> SpatialNorm -> SiLU -> ``conv_out``."""

    def __init__(self, cfg: VAEConfig, *, rngs: nnx.Rngs):
        dt = jnp.dtype(cfg.dtype)
        rev = list(reversed(cfg.block_out_channels))
        g, zc = cfg.norm_num_groups, cfg.latent_channels
        self.conv_in = CausalConv3d(zc, rev[0], 3, dtype=dt, rngs=rngs)
        self.mid_block = MidBlock3D(
            [ResnetBlock3D(rev[0], rev[0], g, cfg.norm_eps, zc, dtype=dt, rngs=rngs) for _ in range(2)])
        blocks = []
        out_ch = rev[0]
        for i, ch in enumerate(rev):
            in_ch, out_ch = out_ch, ch
            resnets = [
                ResnetBlock3D(in_ch if j == 0 else out_ch, out_ch, g, cfg.norm_eps, zc, dtype=dt, rngs=rngs)
                for j in range(cfg.layers_per_block + 1)
            ]
            up = None
            if i < len(rev) - 1:
                up = [Upsample3D(out_ch, i < cfg.temporal_levels, dtype=dt, rngs=rngs)]
            blocks.append(UpBlock3D(resnets, up))
        self.up_blocks = nnx.List(blocks)
        self.norm_out = SpatialNorm3D(rev[-1], zc, g, dtype=dt, rngs=rngs)
        self.conv_out = CausalConv3d(rev[-1], cfg.out_channels, 3, dtype=dt, rngs=rngs)
        _set_conv_impl(self, cfg.conv_impl)

    def __call__(self, z: Array, cache: Cache | None = None) -> tuple[Array, Cache]:
        """z: [B, t, h, w, C_lat] (unscaled) -> frames [B, T, 8h, 8w, 3] and the new cache."""
        cache = cache or {}
        new = {}
        h, new["conv_in"] = self.conv_in(z, cache.get("conv_in"))
        h, new["mid_block"] = self.mid_block.run(h, z, cache.get("mid_block"))
        for i, blk in enumerate(self.up_blocks):
            h, new[f"up_block_{i}"] = blk.run(h, z, cache.get(f"up_block_{i}"))
        h = jax.nn.silu(self.norm_out(h, z))
        h, new["conv_out"] = self.conv_out(h, cache.get("conv_out"))
        return h, new


@dataclasses.dataclass
class DiagonalGaussian:
    """Posterior q(z|x) (``DiagonalGaussianRegularizer``): mean and logvar clamped to [-30, 20].

    Both are ``[B, t, C, h, w]`` float32 (the DiT layout), unscaled.
    """

    mean: Array
    logvar: Array

    @property
    def std(self) -> Array:
        return jnp.exp(0.5 * self.logvar)

    def sample(self, key: Array) -> Array:
        """mean + std * N(0, 1) with ``jax.random.normal(key)``."""
        return self.mean + self.std * jax.random.normal(key, self.mean.shape, self.mean.dtype)

    def mode(self) -> Array:
        return self.mean


jax.tree_util.register_dataclass(DiagonalGaussian, data_fields=["mean", "logvar"], meta_fields=[])



class CogVideoXVAE(nnx.Module):
    """CogVideoX 3-D causal VAE (``AutoencoderKLCogVideoX``, no quant convs).

    Args:
      cfg: :class:`VAEConfig`.
      rngs: parameter init keys.

    Submodules ``encoder``/``decoder`` use diffusers' parameter names (see the converter).
    """

    def __init__(self, cfg: VAEConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.encoder = Encoder3D(cfg, rngs=rngs)
        self.decoder = Decoder3D(cfg, rngs=rngs)

    @classmethod
    def from_config(cls, cfg: Any, *, rngs: nnx.Rngs) -> "CogVideoXVAE":
        """From the ``vae`` ConfigDict section (or a VAEConfig)."""
        return cls(cfg if isinstance(cfg, VAEConfig) else VAEConfig.from_config(cfg), rngs=rngs)

    # -- encode ---------------------------------------------------------------------------------

    def encode(self, video: Array, plan: Sequence[int] | None = None) -> DiagonalGaussian:
        """Encodes video to the posterior.

        Args:
          video: ``[B, T, 8h, 8w, 3]`` float in [-1, 1]; T = 1 + 4k (or any T the plan allows),
            height and width multiples of 8 (spatial_factor).
          plan: frame chunk sizes; default from ``cfg.encode_chunks`` ((0, 0) = whole clip, as
            the SAT training ``encode_first_stage``; use ``diffusers_plan(T, 8)`` for diffusers).

        Returns:
          :class:`DiagonalGaussian` with mean/logvar ``[B, t, C, h, w]`` float32, unscaled.
        """
        if plan is None:
            plan = chunk_plan(video.shape[1], *self.cfg.encode_chunks)
        x = constrain(video.astype(jnp.dtype(self.cfg.dtype)), _ACT_AXES)
        moments = run_chunked(lambda xc, c: self.encoder(xc, c), x, plan).astype(jnp.float32)
        moments = jnp.moveaxis(moments, -1, 2)
        mean, logvar = jnp.split(moments, 2, axis=2)
        return DiagonalGaussian(mean, jnp.clip(logvar, -30.0, 20.0))

    # -- decode ---------------------------------------------------------------------------------

    def decode(self, latents: Array, plan: Sequence[int] | None = None) -> Array:
        """Decodes unscaled latents with causal caches carried across time chunks.

        Args:
          latents: ``[B, t, C, h, w]`` (unscaled, i.e. already divided by scaling_factor).
          plan: latent chunk sizes; default ``chunk_plan(t, *cfg.decode_chunks)`` = the
            release plan (3, 2, 2, ...). ``diffusers_plan(t, 2)`` is diffusers'.

        Returns:
          ``[B, T, 8h, 8w, 3]`` float32, roughly in [-1, 1] (not clipped). With the default plan
          T = 1 + 4 (t - 1).
        """
        if plan is None:
            plan = chunk_plan(latents.shape[1], *self.cfg.decode_chunks)
        z = jnp.moveaxis(latents, 2, -1).astype(jnp.dtype(self.cfg.dtype))
        out = run_chunked(lambda zc, c: self.decoder(zc, c), z, plan)
        return out.astype(jnp.float32)

    def tiled_decode(
        self,
        latents: Array,
        tile_size: int | tuple[int, int] | None = None,
        overlap: float | None = None,
        plan: Sequence[int] | None = None,
        decode_fn: Callable[[Array], Array] | None = None,
    ) -> Array:
        """Spatially tiled decode with linear cross-fade blending of overlapping tiles.

        The latent plane is covered by equal tiles (so one compiled decode serves all of them,
        run one at a time by ``lax.scan``: memory is one tile's activations); tile starts are
        spread evenly so neighbours overlap by >= ``tile * overlap`` latent px. Each decoded tile
        is weighted by separable linear ramps over the overlap (8x in output px) and the
        weighted sum is normalised, so seams cross-fade. Unlike diffusers' ``tiled_decode``
        (ragged edge tiles, crop-and-blend), every output pixel is a convex mix of tiles.

        Args:
          latents: ``[B, t, C, h, w]`` unscaled.
          tile_size: latent tile (th, tw) or one int; default ``cfg.tile_size``.
          overlap: overlap fraction in [0, 1); default ``cfg.tile_overlap``.
          plan: decode chunk plan (see :meth:`decode`).
          decode_fn: ``[B, t, C, th, tw] -> [B, T, sf th, sf tw, 3]``; default :meth:`decode`.

        Returns:
          ``[B, T, 8h, 8w, 3]`` float32.

        Raises:
          ValueError: tile size not positive or overlap outside [0, 1).
        """
        tile_size = self.cfg.tile_size if tile_size is None else tile_size
        overlap = self.cfg.tile_overlap if overlap is None else float(overlap)
        th, tw = (tile_size, tile_size) if isinstance(tile_size, int) else tuple(tile_size)
        if th <= 0 or tw <= 0 or not 0.0 <= overlap < 1.0:
            raise ValueError(f"tiled_decode: need tile > 0 and 0 <= overlap < 1, got {(th, tw)}, {overlap}")
        if decode_fn is None:
            decode_fn = lambda z: self.decode(z, plan)  # noqa: E731
        return tiled_apply(decode_fn, latents, (th, tw), overlap, self.cfg.spatial_factor)



# ----------------------------------------------------------------------------------------------
# Latent-scale helpers (docs/diffusion.md#latent-scale)
# ----------------------------------------------------------------------------------------------


def encode_video(
    vae: CogVideoXVAE, video: Array, key: Array | None = None, plan: Sequence[int] | None = None
) -> Array:
    """Video -> scaled latents ``z = scaling_factor * sample(q(z|x))`` (mean when ``key`` is None).

    Args:
      video: ``[B, T, 8h, 8w, 3]`` float in [-1, 1].
      key: PRNG key for the posterior sample (the release samples); None = posterior mean.
      plan: encode chunk plan (see :meth:`CogVideoXVAE.encode`).

    Returns:
      ``[B, t, C, h, w]`` float32, scaled by ``cfg.scaling_factor`` (1.15258426).
    """
    post = vae.encode(video, plan)
    z = post.mean if key is None else post.sample(key)
    return z * vae.cfg.scaling_factor


def decode_latents(
    vae: CogVideoXVAE, latents: Array, plan: Sequence[int] | None = None, tiled: bool | None = None
) -> Array:
    """Scaled latents -> video ``VAE_dec(z / scaling_factor)``, clipped to [-1, 1].

    Args:
      latents: ``[B, t, C, h, w]`` scaled (as the DiT produces them).
      plan: decode chunk plan; default the release plan.
      tiled: spatial tiling; default ``cfg.tile_size > 0`` (-1: ``vae_tiling.resolve_decode_tiling``).

    Returns:
      ``[B, T, 8h, 8w, 3]`` float32 in [-1, 1]; ``media.to_uint8`` maps it to uint8 frames.
    """
    z = latents / vae.cfg.scaling_factor
    tile = vae.cfg.tile_size
    if tile < 0:  # auto: from the device's memory
        tile, auto_plan, _ = resolve_decode_tiling(vae.cfg, (latents.shape[1],) + tuple(latents.shape[3:]))
        plan = auto_plan if plan is None else plan
    tiled = tile > 0 if tiled is None else tiled
    x = vae.tiled_decode(z, tile_size=tile or None, plan=plan) if tiled else vae.decode(z, plan)
    return jnp.clip(x, -1.0, 1.0)


def count_params(cfg: VAEConfig) -> int:
    """Parameter count of the full network via ``nnx.eval_shape`` (no allocation)."""
    abstract = nnx.eval_shape(lambda: CogVideoXVAE(cfg, rngs=nnx.Rngs(0)))
    return int(sum(np.prod(x.shape) for x in jax.tree.leaves(nnx.state(abstract, nnx.Param))))
