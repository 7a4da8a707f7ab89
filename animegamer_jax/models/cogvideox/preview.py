"""The preview decoder: a small conv decoder distilled from the CogVideoX VAE decoder (training phase
``preview``; not in the paper).

TAEHV-like (a tiny autoencoder for video latents): per-frame 3x3 convs, one causal time tap per block,
no attention, no normalisation. It maps the DiT's scaled latents to frames the shape the VAE decodes:

  latents ``[B, t, C, h, w]`` (scaled, as the DiT samples them)
    -> frames ``[B, 1 + 4 (t - 1), 8h, 8w, 3]`` float32, clipped to [-1, 1]

(the temporal factor is ``vae.temporal_compression_ratio``, the spatial one the VAE's ``2 ** (levels
- 1)``; the causal VAE's first latent frame gives one frame, every later one four).

Layout, channels ``c_0 .. c_n`` (``preview.channels``, n = spatial levels = log2 of the spatial factor sf;
tf the temporal factor):

  conv_in (C -> c_0, 3x3) -> ReLU -> block(c_0)          at latent size, t frames
  time_up (c_0 -> tf c_0, 1x1): each latent frame -> tf frames, the first tf - 1 frames dropped
  level i = 1..n: nearest 2x -> conv (c_{i-1} -> c_i, 3x3) -> ReLU -> block(c_i)
  conv_out (c_n -> 3, 3x3)

``block(c)``: ``x + conv2(relu(conv1(concat(x, x shifted one frame back))))`` (3x3 convs; the first
frame sees itself as its past), so information flows forward in time only (causal). Parameters are
float32 with the VAE's logical axes (``conv_in`` / ``conv_out``); activations run in ``vae.dtype``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from animegamer_jax.models.cogvideox.vae import Conv2d

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class PreviewConfig:
    """Sizes of the preview decoder.

    Attributes:
      latent_channels: latent channels C (``vae.latent_channels``).
      channels: ``(c_0, c_1, ..., c_L)``: width at latent size, then after each 2x spatial upsampling;
        L = log2 of the spatial factor (3 for the CogVideoX VAE's 8x).
      temporal_factor: frames per latent frame after the first (``vae.temporal_compression_ratio``, 4).
      scaling_factor: the latent scale (``vae.scaling_factor``); inputs are divided by it.
      dtype: activation dtype name (``vae.dtype``); parameters stay float32.
    """

    latent_channels: int = 16
    channels: tuple[int, ...] = (256, 128, 64, 32)
    temporal_factor: int = 4
    scaling_factor: float = 1.15258426
    dtype: str = "float32"

    @classmethod
    def from_config(cls, config: Any) -> "PreviewConfig":
        """From the full config: ``preview.channels`` and the VAE's latent channels, temporal factor,
        scale and dtype.

        Raises:
          ValueError: no ``preview`` section, or its channel count does not match the VAE's spatial factor.
        """
        if "preview" not in config:
            raise ValueError(f"config {config.get('name', '')!r} has no 'preview' section (preview.channels): "
                             f"it predates the preview decoder; use the config the preview phase saved")
        v = config.vae
        channels = tuple(int(c) for c in config.preview.channels)
        levels = len(tuple(v.block_out_channels)) - 1
        if len(channels) != levels + 1 or min(channels) < 1:
            raise ValueError(f"preview.channels={channels} needs {levels + 1} positive widths (latent size, "
                             f"then one per 2x of the VAE's {2 ** levels}x spatial factor)")
        return cls(latent_channels=int(v.latent_channels), channels=channels,
                   temporal_factor=int(v.temporal_compression_ratio), scaling_factor=float(v.scaling_factor),
                   dtype=str(v.dtype))

    @property
    def spatial_factor(self) -> int:
        return 2 ** (len(self.channels) - 1)


def num_frames(num_latent_frames: int, temporal_factor: int = 4) -> int:
    """Frames the preview (and the VAE's release plan) gives for ``num_latent_frames`` t: ``1 + temporal_factor (t - 1)``."""
    return 1 + temporal_factor * (int(num_latent_frames) - 1)


class CausalBlock(nnx.Module):
    """``x + conv2(relu(conv1([x, x_prev])))`` on ``[B, T, h, w, c]``; ``x_prev`` is ``x`` one frame
    back (frame 0: itself)."""

    def __init__(self, c: int, *, dtype, rngs: nnx.Rngs):
        self.conv1 = Conv2d(2 * c, c, 3, 1, 1, dtype=dtype, rngs=rngs)
        self.conv2 = Conv2d(c, c, 3, 1, 1, dtype=dtype, rngs=rngs)

    def __call__(self, x: Array) -> Array:
        prev = jnp.concatenate([x[:, :1], x[:, :-1]], axis=1)
        return x + self.conv2(jax.nn.relu(self.conv1(jnp.concatenate([x, prev], axis=-1))))


class PreviewDecoder(nnx.Module):
    """Scaled latents ``[B, t, C, h, w]`` -> frames ``[B, 1 + tf (t - 1), sf h, sf w, 3]`` float32
    in [-1, 1] (module docstring). Jit it with ``nnx.jit`` or split / merge inside a ``jax.jit``."""

    def __init__(self, cfg: PreviewConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        dt = jnp.dtype(cfg.dtype)
        ch = cfg.channels
        self.conv_in = Conv2d(cfg.latent_channels, ch[0], 3, 1, 1, dtype=dt, rngs=rngs)
        self.block_in = CausalBlock(ch[0], dtype=dt, rngs=rngs)
        self.time_up = Conv2d(ch[0], cfg.temporal_factor * ch[0], 1, 1, 0, dtype=dt, rngs=rngs)
        self.up_convs = nnx.List([Conv2d(ch[i - 1], ch[i], 3, 1, 1, dtype=dt, rngs=rngs) for i in range(1, len(ch))])
        self.up_blocks = nnx.List([CausalBlock(ch[i], dtype=dt, rngs=rngs) for i in range(1, len(ch))])
        self.conv_out = Conv2d(ch[-1], 3, 3, 1, 1, dtype=dt, rngs=rngs)

    @classmethod
    def from_config(cls, config: Any, *, rngs: nnx.Rngs) -> "PreviewDecoder":
        return cls(PreviewConfig.from_config(config), rngs=rngs)

    def __call__(self, latents: Array) -> Array:
        cfg = self.cfg
        dt = jnp.dtype(cfg.dtype)
        x = (jnp.moveaxis(latents, 2, -1) / cfg.scaling_factor).astype(dt)  # [B, t, h, w, C]
        x = self.block_in(jax.nn.relu(self.conv_in(x)))
        b, t, h, w, c = x.shape
        r = cfg.temporal_factor
        x = self.time_up(x).reshape(b, t, h, w, r, c)
        x = jnp.moveaxis(x, 4, 2).reshape(b, t * r, h, w, c)[:, r - 1:]  # 1 + r (t - 1) frames
        for conv, block in zip(self.up_convs, self.up_blocks):
            x = jnp.repeat(jnp.repeat(x, 2, axis=2), 2, axis=3)
            x = block(jax.nn.relu(conv(x)))
        return jnp.clip(self.conv_out(x).astype(jnp.float32), -1.0, 1.0)


def count_params(cfg: PreviewConfig) -> int:
    """Parameter count via ``nnx.eval_shape`` (no allocation)."""
    abstract = nnx.eval_shape(lambda: PreviewDecoder(cfg, rngs=nnx.Rngs(0)))
    return int(sum(np.prod(x.shape) for x in jax.tree.leaves(nnx.state(abstract, nnx.Param))))


def conv_flops(cfg: PreviewConfig, latent_shape: tuple[int, int, int]) -> float:
    """Multiply-add FLOPs (2 per MAC) of one clip of ``(t, h, w)`` latents, counted layer by layer."""
    t, h, w = (int(v) for v in latent_shape)
    ch, r = cfg.channels, cfg.temporal_factor
    f = num_frames(t, r)
    k = 9
    total = 2 * t * h * w * (k * cfg.latent_channels * ch[0] + k * 3 * ch[0] * ch[0] + r * ch[0] * ch[0])
    for i in range(1, len(ch)):
        h, w = 2 * h, 2 * w
        total += 2 * f * h * w * k * (ch[i - 1] * ch[i] + 3 * ch[i] * ch[i])
    total += 2 * f * h * w * k * ch[-1] * 3
    return float(total)


__all__ = ["PreviewConfig", "PreviewDecoder", "count_params", "conv_flops", "num_frames"]
