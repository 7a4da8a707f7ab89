"""Shot encoder E_a: the action-aware multimodal representation s_a (paper §3.2 Eq. 1).

docs/encoders.md#shot-encoder-projection (release: ``ImagePatchEmbeddingMixin`` with ``ip_hidden_size=768``,
``use_attention_mix=False``)::

    text  = LN_txt(Linear(1920->1920)(GELU(Linear(4096->1920)(f_md))))    # [B, Lt = 30, 1920]
    image = LN_ip (Linear(1920->1920)(GELU(Linear( 768->1920)(f_v ))))    # [B, P = 196, 1920]
    s_a   = concat([text, image], token axis)                            # [B, Q = 226, 1920], text first

GELU is exact (erf); the LayerNorms are affine with eps 1e-5 (``nn.LayerNorm`` default).
``output_mix_layer_norm`` exists in the release checkpoint but is unused on this path, so it is
not a parameter here (its converter skips it on purpose).

The unconditional embedding for CFG (docs/encoders.md#unconditional-embedding) is E_a of zero inputs
through the *trained* projections: two constant vectors from the biases, not zeros.

Checkpoint names (SAT DiT checkpoint, ``model.diffusion_model.mixins.patch_embed.``):
``text_proj.0`` / ``text_proj.2`` -> ``text_proj.fc_in`` / ``text_proj.fc_out``; same for ``ip_proj``;
``txt_mix_layer_norm`` / ``ip_mix_layer_norm`` -> same names (see ``models/shot_encoder/convert.py``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from animegamer_jax.models.clip.model import Dense
from animegamer_jax.models.layers import LayerNorm
from animegamer_jax.parallel import constrain


@dataclasses.dataclass(frozen=True)
class ShotEncoderConfig:
    """Sizes from the ``shot_encoder`` and ``rep`` config sections."""

    dim: int = 1920
    text_dim: int = 4096
    image_dim: int = 768
    num_text_tokens: int = 30
    num_image_tokens: int = 196
    layer_norm_eps: float = 1e-5
    dtype: str = "float32"

    @classmethod
    def from_config(cls, cfg: Any) -> "ShotEncoderConfig":
        """From the full config (``cfg.shot_encoder`` + ``cfg.rep``)."""
        s, r = cfg.shot_encoder, cfg.rep
        return cls(dim=r.dim, text_dim=s.text_dim, image_dim=s.image_dim, num_text_tokens=r.num_text_tokens,
                   num_image_tokens=r.num_image_tokens, layer_norm_eps=s.layer_norm_eps,
                   dtype=s.get("dtype", "float32"))

    @property
    def num_tokens(self) -> int:
        return self.num_text_tokens + self.num_image_tokens


class ProjMLP(nnx.Module):
    """Linear(d_in -> dim) - GELU (exact) - Linear(dim -> dim) (release ``nn.Sequential`` indices 0, 2)."""

    def __init__(self, d_in: int, dim: int, *, rngs: nnx.Rngs):
        self.fc_in = Dense(d_in, dim, ("embed", "mlp"), rngs=rngs)
        self.fc_out = Dense(dim, dim, ("mlp", "embed"), rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.fc_out(jax.nn.gelu(self.fc_in(x), approximate=False))


class ShotEncoder(nnx.Module):
    """E_a: (f_md, f_v) -> s_a. Params ``text_proj``, ``ip_proj``, ``txt_mix_layer_norm``, ``ip_mix_layer_norm``."""

    def __init__(self, cfg: ShotEncoderConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.text_proj = ProjMLP(cfg.text_dim, cfg.dim, rngs=rngs)
        self.ip_proj = ProjMLP(cfg.image_dim, cfg.dim, rngs=rngs)
        self.txt_mix_layer_norm = LayerNorm(cfg.dim, cfg.layer_norm_eps, rngs=rngs)
        self.ip_mix_layer_norm = LayerNorm(cfg.dim, cfg.layer_norm_eps, rngs=rngs)

    @classmethod
    def from_config(cls, cfg: Any, *, rngs: nnx.Rngs) -> "ShotEncoder":
        return cls(ShotEncoderConfig.from_config(cfg), rngs=rngs)

    def __call__(self, text_features: jax.Array, image_features: jax.Array) -> jax.Array:
        """Computes s_a (Eq. 1).

        Args:
          text_features: f_md, [B, Lt, text_dim] T5 last hidden states (Lt = 30).
          image_features: f_v, [B, P, image_dim] CLIP penultimate patch tokens (P = 196).

        Returns:
          [B, Lt + P, dim] in ``cfg.dtype``, text tokens first.

        Raises:
          ValueError: feature widths that do not match the config.
        """
        cfg = self.cfg
        if text_features.shape[-1] != cfg.text_dim or image_features.shape[-1] != cfg.image_dim:
            raise ValueError(
                f"ShotEncoder expects widths text {cfg.text_dim} / image {cfg.image_dim}, got "
                f"{text_features.shape[-1]} / {image_features.shape[-1]}"
            )
        dt = jnp.dtype(cfg.dtype)
        t = self.txt_mix_layer_norm(self.text_proj(text_features.astype(dt)))
        i = self.ip_mix_layer_norm(self.ip_proj(image_features.astype(dt)))
        out = jnp.concatenate([t, i], axis=1)
        return constrain(out, ("act_batch", "act_length", "act_embed"))

    def uncond(self, batch_size: int = 1) -> jax.Array:
        """Unconditional s_a for CFG (docs/encoders.md#unconditional-embedding): E_a of
        zeros [B, Lt, text_dim] and zeros [B, P, image_dim].

        Returns [B, Lt + P, dim]; row-constant within each branch and generally non-zero.
        """
        cfg = self.cfg
        z_t = jnp.zeros((batch_size, cfg.num_text_tokens, cfg.text_dim), jnp.dtype(cfg.dtype))
        z_i = jnp.zeros((batch_size, cfg.num_image_tokens, cfg.image_dim), jnp.dtype(cfg.dtype))
        return self(z_t, z_i)
