"""T5 v1.1 encoder (``google/t5-v1_1-xxl`` ``T5EncoderModel``) in Flax NNX, frozen text encoder f_md.

Follows docs/encoders.md#t5-action-text and HF ``transformers/models/t5/modeling_t5.py`` (encoder stack):

* token embedding ``shared`` [V, D], no scaling, no absolute positions;
* per block: T5 RMS norm (no mean, no bias; fp32 statistics) -> self-attention with *no*
  1/sqrt(d) scaling (folded into the init) and a learned relative position bias shared by all
  layers (bidirectional buckets, stored once, HF keeps it in block 0) -> residual;
  RMS norm -> gated-GELU FFN ``wo(gelu_tanh(wi_0 x) * wi_1 x)`` (T5 v1.1 ``gated-gelu`` maps to
  ``gelu_new``, the tanh approximation) -> residual; all Linears without bias;
* final RMS norm. Output [B, L, D]: [B, 30, 4096] at full size (shapes:
  docs/design.md#dimension-letters).

No attention mask by default (the release passes none, so pads are attended: CogVideoX
convention). The default compute dtype is fp32: without a mask, bf16 overflows the residual
stream of T5 v1.1 XXL (docs/release_quirks.md).

Blocks are stacked (leading ``layers`` axis) and run with ``jax.lax.scan``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from animegamer_jax.models import remat as remat_lib
from animegamer_jax.models.common import param
from animegamer_jax.models.layers import RMSNorm, stacked
from animegamer_jax.models import attention
from animegamer_jax.parallel import constrain


@dataclasses.dataclass(frozen=True)
class T5Config:
    """T5 v1.1 encoder sizes (fields of the ``t5`` config section; unknown fields ignored)."""

    vocab_size: int = 32128
    d_model: int = 4096
    d_kv: int = 64
    d_ff: int = 10240
    num_layers: int = 24
    num_heads: int = 64
    relative_attention_num_buckets: int = 32
    relative_attention_max_distance: int = 128
    layer_norm_eps: float = 1e-6
    dtype: str = "float32"
    remat: str = "none"  # models/remat.py policy of the block scan

    def __post_init__(self):
        object.__setattr__(self, "remat", remat_lib.policy_name(self.remat))
    attention_impl: str = "auto"  # animegamer_jax.models.attention implementation (no params depend on it)

    @classmethod
    def from_config(cls, cfg: Any) -> "T5Config":
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in dict(cfg).items() if k in names})


def relative_position_buckets(q_len: int, k_len: int, num_buckets: int, max_distance: int) -> np.ndarray:
    """Bidirectional T5 relative position buckets, (q_len, k_len) int32 (HF ``_relative_position_bucket``).

    Half the buckets for keys after the query; within a half, exact buckets for distances below
    ``num_buckets // 4`` and log-spaced ones up to ``max_distance``. Computed in float32 like the
    reference so bucket boundaries match exactly.
    """
    rel = np.arange(k_len)[None, :] - np.arange(q_len)[:, None]
    nb = num_buckets // 2
    buckets = (rel > 0).astype(np.int64) * nb
    rel = np.abs(rel)
    max_exact = nb // 2
    with np.errstate(divide="ignore"):
        large = max_exact + (
            np.log(np.maximum(rel, 1).astype(np.float32) / max_exact)
            / np.float32(math.log(max_distance / max_exact))
            * (nb - max_exact)
        ).astype(np.int64)
    large = np.minimum(large, nb - 1)
    return (buckets + np.where(rel < max_exact, rel, large)).astype(np.int32)


def _param(rngs, shape, names, std=1.0):
    """N(0, std) float32 parameter (``models/common.param``)."""
    return param(rngs, jax.nn.initializers.normal(std), shape, names)


class T5Attention(nnx.Module):
    """Unscaled multi-head self-attention, no biases. q/k/v [D, N, H], o [N, H, D]."""

    def __init__(self, cfg: T5Config, *, rngs: nnx.Rngs):
        d, n, h = cfg.d_model, cfg.num_heads, cfg.d_kv
        self.attention_impl = cfg.attention_impl
        self.q = _param(rngs, (d, n, h), ("embed", "heads", "head_dim"), (d * h) ** -0.5)
        self.k = _param(rngs, (d, n, h), ("embed", "heads", "head_dim"), d**-0.5)
        self.v = _param(rngs, (d, n, h), ("embed", "heads", "head_dim"), d**-0.5)
        self.o = _param(rngs, (n, h, d), ("heads", "head_dim", "embed"), (n * h) ** -0.5)

    def __call__(self, x: jax.Array, bias: jax.Array, mask: attention.AttentionMask | None = None) -> jax.Array:
        """x: [B, L, D]; bias: [B|1, N, L, L] fp32 position bias; mask: key padding. Returns [B, L, D]."""
        dt = x.dtype
        q = jnp.einsum("BLD,DNH->BLNH", x, self.q[...].astype(dt))
        k = jnp.einsum("BLD,DNH->BLNH", x, self.k[...].astype(dt))
        v = jnp.einsum("BLD,DNH->BLNH", x, self.v[...].astype(dt))
        q = constrain(q, ("act_batch", "act_length", "act_heads", None))
        out = attention.dot_product_attention(q, k, v, bias=bias, mask=mask, scale=1.0,
                                              implementation=self.attention_impl)
        return jnp.einsum("BLNH,NHD->BLD", out, self.o[...].astype(dt))


class T5GatedFFN(nnx.Module):
    """wo(gelu_tanh(x wi_0) * (x wi_1)); wi_0 / wi_1 [D, F], wo [F, D], no biases."""

    def __init__(self, cfg: T5Config, *, rngs: nnx.Rngs):
        d, f = cfg.d_model, cfg.d_ff
        self.wi_0 = _param(rngs, (d, f), ("embed", "mlp"), d**-0.5)
        self.wi_1 = _param(rngs, (d, f), ("embed", "mlp"), d**-0.5)
        self.wo = _param(rngs, (f, d), ("mlp", "embed"), f**-0.5)

    def __call__(self, x: jax.Array) -> jax.Array:
        dt = x.dtype
        h = jax.nn.gelu(x @ self.wi_0[...].astype(dt), approximate=True) * (x @ self.wi_1[...].astype(dt))
        h = constrain(h, ("act_batch", "act_length", "act_mlp"))
        return h @ self.wo[...].astype(dt)


class T5Block(nnx.Module):
    """x + attn(rms(x), bias); x + ffn(rms(x)) (HF ``T5Block`` of the encoder)."""

    def __init__(self, cfg: T5Config, *, rngs: nnx.Rngs):
        self.attn_norm = RMSNorm(cfg.d_model, cfg.layer_norm_eps, rngs=rngs)
        self.attn = T5Attention(cfg, rngs=rngs)
        self.ffn_norm = RMSNorm(cfg.d_model, cfg.layer_norm_eps, rngs=rngs)
        self.ffn = T5GatedFFN(cfg, rngs=rngs)

    def __call__(self, x: jax.Array, bias: jax.Array, mask: attention.AttentionMask | None = None) -> jax.Array:
        x = x + self.attn(self.attn_norm(x), bias, mask)
        x = x + self.ffn(self.ffn_norm(x))
        return constrain(x, ("act_batch", "act_length", "act_embed"))


class T5Encoder(nnx.Module):
    """T5 v1.1 encoder stack. Params: ``shared`` [V, D], ``relative_attention_bias`` [buckets, N],
    ``blocks`` (stacked, ``num_layers`` layers), ``final_layer_norm``."""

    def __init__(self, cfg: T5Config, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.shared = _param(rngs, (cfg.vocab_size, cfg.d_model), ("vocab", "embed"))
        self.relative_attention_bias = _param(rngs, (cfg.relative_attention_num_buckets, cfg.num_heads),
                                              (None, "heads"))
        self.blocks = stacked(cfg.num_layers, lambda r: T5Block(cfg, rngs=r), rngs)
        self.final_layer_norm = RMSNorm(cfg.d_model, cfg.layer_norm_eps, rngs=rngs)

    @classmethod
    def from_config(cls, cfg: Any, *, rngs: nnx.Rngs) -> "T5Encoder":
        return cls(T5Config.from_config(cfg), rngs=rngs)

    def position_bias(self, length: int) -> jax.Array:
        """(1, N, L, L) fp32 relative position bias."""
        buckets = relative_position_buckets(
            length, length, self.cfg.relative_attention_num_buckets, self.cfg.relative_attention_max_distance
        )
        return self.relative_attention_bias[...][buckets].transpose(2, 0, 1)[None]

    def __call__(self, ids: jax.Array, attention_mask: jax.Array | None = None) -> jax.Array:
        """Encodes token ids.

        Args:
          ids: int32 [B, L] token ids (pad id 0).
          attention_mask: optional [B, L] {0,1}; None (the release's setting) attends to pads.

        Returns:
          [B, L, D] last hidden state in ``cfg.dtype`` (fp32 by default).
        """
        dt = jnp.dtype(self.cfg.dtype)
        x = self.shared[...].astype(dt)[ids]
        x = constrain(x, ("act_batch", "act_length", "act_embed"))
        bias = self.position_bias(ids.shape[1])
        mask = None if attention_mask is None else attention.AttentionMask(kv_valid=attention_mask > 0)
        graphdef, state = nnx.split(self.blocks)

        def body(h, st):
            return nnx.merge(graphdef, st)(h, bias, mask), None

        x, _ = jax.lax.scan(remat_lib.remat(body, self.cfg.remat), x, state)
        return self.final_layer_norm(x)
