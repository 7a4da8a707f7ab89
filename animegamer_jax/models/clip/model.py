"""CLIP ViT (OpenCLIP ViT-B/16 laion2b_s34b_b88k layout) in Flax NNX: vision and text towers.

Follows docs/encoders.md#clip-image-tower (the release's ``FrozenOpenCLIPImageEmbedder_196``) and the
open_clip / HF ``CLIPModel`` architecture (pre-LN transformer, QuickGELU or exact GELU read from
the config):

* vision: patchify conv (no bias) -> prepend class embedding -> + positional embedding ->
  ``ln_pre`` -> residual blocks -> ``ln_post`` on CLS -> projection.
* the shot encoder's reference feature f_v is the output of the *penultimate* block
  (blocks 0 .. vision_layers - 2), without ``ln_post`` and without the CLS token: [B, P, D] =
  [B, 196, 768] at full size (shapes: docs/design.md#dimension-letters).
* text: token + positional embedding -> causal residual blocks -> ``ln_final`` -> the EOT token
  (the largest id, open_clip's ``argmax``) -> projection. Only evaluation (CLIP-T) uses it.

Images are channels-last [B, h, w, 3]; the release feeds [B, 3, h, w].

Preprocessing (:func:`preprocess`): the release resizes with kornia
(``resize(x, (224, 224), interpolation="bicubic", align_corners=True, antialias=True)``): a
separable Gaussian blur (sigma = max((scale - 1) / 2, 0.001) per axis, kernel
``int(max(4 sigma, 3))`` made odd, reflect borders) followed by torch bicubic sampling
(a = -0.75, corner-aligned grid, clamped borders). ``resize_method="kornia"`` (default) reproduces it
exactly as one (out, in) matrix per axis (checked against diffusers' verbatim copy,
``stable_video_diffusion._resize_with_antialiasing``, to ~1e-6). ``resize_method="jax"`` uses
``jax.image.resize(method="bicubic", antialias=True)`` instead: a Keys cubic (a = -0.5) kernel
stretched by the downscale factor with half-pixel centres, i.e. torch ``F.interpolate(mode=
"bicubic", antialias=True, align_corners=False)`` / PIL bicubic; it differs from the release's
resize on a 480x720 bigbuckbunny frame by 0.02 mean / 0.3 max (in [-1, 1] units: different
low-pass filter and grid alignment), so use it only where release parity does not matter.

Repeated blocks are created stacked (``nnx.vmap`` over the init, leading ``layers`` axis) and run
with ``jax.lax.scan``.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from animegamer_jax.models import remat as remat_lib
from animegamer_jax.models.common import param as _param
from animegamer_jax.models.layers import LayerNorm, stacked
from animegamer_jax.models import attention
from animegamer_jax.parallel import constrain

#: CLIP normalization constants (OpenAI / open_clip ``OPENAI_DATASET_MEAN`` / ``_STD``),
#: docs/encoders.md#clip-image-tower.
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)

_ACTS = ("gelu", "quick_gelu")


@dataclasses.dataclass(frozen=True)
class CLIPConfig:
    """CLIP sizes (fields of the ``clip`` config section; see configs/animegamer_2b_7b.py).

    ``eot_token_id`` None pools the text tower at ``argmax(ids)`` (open_clip, the EOT id is the
    largest id of the BPE vocab); an int pools at the first occurrence of that id (HF CLIP with
    ``eos_token_id != 2``).
    """

    image_size: int = 224
    patch_size: int = 16
    vision_width: int = 768
    vision_layers: int = 12
    vision_heads: int = 12
    vision_mlp_dim: int = 3072
    text_width: int = 512
    text_layers: int = 12
    text_heads: int = 8
    text_mlp_dim: int = 2048
    text_vocab_size: int = 49408
    text_context_length: int = 77
    embed_dim: int = 512
    hidden_act: str = "gelu"
    layer_norm_eps: float = 1e-5
    dtype: str = "float32"
    eot_token_id: int | None = None
    remat: str = "none"  # models/remat.py policy of both towers' block scans
    attention_impl: str = "auto"  # animegamer_jax.models.attention implementation (no params depend on it)

    def __post_init__(self):
        object.__setattr__(self, "remat", remat_lib.policy_name(self.remat))
        if self.hidden_act not in _ACTS:
            raise ValueError(f"clip.hidden_act must be one of {_ACTS}, got {self.hidden_act!r}")
        if self.image_size % self.patch_size:
            raise ValueError(f"clip.image_size {self.image_size} is not a multiple of patch_size {self.patch_size}")

    @classmethod
    def from_config(cls, cfg: Any) -> "CLIPConfig":
        """Builds from an ``ml_collections`` ``clip`` section (unknown fields ignored)."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in dict(cfg).items() if k in names})

    @property
    def grid(self) -> int:
        return self.image_size // self.patch_size

    @property
    def num_patches(self) -> int:
        return self.grid**2


def _act(name: str, x: jax.Array) -> jax.Array:
    if name == "quick_gelu":
        return x * jax.nn.sigmoid(1.702 * x)
    return jax.nn.gelu(x, approximate=False)


_normal = jax.nn.initializers.normal(0.02)
_zeros = jax.nn.initializers.zeros
_ones = jax.nn.initializers.ones


class Dense(nnx.Module):
    """y = x @ kernel + bias. kernel (in, out) with logical names ``names``."""

    def __init__(self, d_in: int, d_out: int, names: tuple, *, rngs: nnx.Rngs, use_bias: bool = True):
        self.kernel = _param(rngs, _normal, (d_in, d_out), names)
        self.bias = _param(rngs, _zeros, (d_out,), names[1:]) if use_bias else None

    def __call__(self, x: jax.Array) -> jax.Array:
        y = x @ self.kernel[...].astype(x.dtype)
        if self.bias is not None:
            y = y + self.bias[...].astype(x.dtype)
        return y


class Attention(nnx.Module):
    """Multi-head self-attention with biased q/k/v/o (open_clip ``nn.MultiheadAttention``).

    q/k/v kernels [D, N, H] ``("embed", "heads", "head_dim")``; o kernel [N, H, D].
    """

    def __init__(self, dim: int, heads: int, *, rngs: nnx.Rngs, attention_impl: str = "auto"):
        if dim % heads:
            raise ValueError(f"width {dim} not divisible by {heads} heads")
        hd = dim // heads
        self.heads, self.head_dim = heads, hd
        self.attention_impl = attention_impl
        for n in ("q", "k", "v"):
            setattr(self, f"{n}_kernel", _param(rngs, _normal, (dim, heads, hd), ("embed", "heads", "head_dim")))
            setattr(self, f"{n}_bias", _param(rngs, _zeros, (heads, hd), ("heads", "head_dim")))
        self.o_kernel = _param(rngs, _normal, (heads, hd, dim), ("heads", "head_dim", "embed"))
        self.o_bias = _param(rngs, _zeros, (dim,), ("embed",))

    def __call__(self, x: jax.Array, mask: attention.AttentionMask | None) -> jax.Array:
        """x: [B, L, D]; mask: :class:`~animegamer_jax.models.attention.AttentionMask` or None. Returns [B, L, D]."""
        dt = x.dtype
        q = jnp.einsum("BLD,DNH->BLNH", x, self.q_kernel[...].astype(dt)) + self.q_bias[...].astype(dt)
        k = jnp.einsum("BLD,DNH->BLNH", x, self.k_kernel[...].astype(dt)) + self.k_bias[...].astype(dt)
        v = jnp.einsum("BLD,DNH->BLNH", x, self.v_kernel[...].astype(dt)) + self.v_bias[...].astype(dt)
        q = constrain(q, ("act_batch", "act_length", "act_heads", None))
        out = attention.dot_product_attention(q, k, v, mask=mask, scale=self.head_dim**-0.5,
                                              implementation=self.attention_impl)
        return jnp.einsum("BLNH,NHD->BLD", out, self.o_kernel[...].astype(dt)) + self.o_bias[...].astype(dt)


class ResidualBlock(nnx.Module):
    """Pre-LN block: x + attn(ln_1(x)); x + mlp(ln_2(x)) (open_clip ``ResidualAttentionBlock``)."""

    def __init__(self, dim: int, heads: int, mlp_dim: int, act: str, eps: float, *, rngs: nnx.Rngs,
                 attention_impl: str = "auto"):
        self.act = act
        self.ln_1 = LayerNorm(dim, eps, rngs=rngs)
        self.attn = Attention(dim, heads, rngs=rngs, attention_impl=attention_impl)
        self.ln_2 = LayerNorm(dim, eps, rngs=rngs)
        self.c_fc = Dense(dim, mlp_dim, ("embed", "mlp"), rngs=rngs)
        self.c_proj = Dense(mlp_dim, dim, ("mlp", "embed"), rngs=rngs)

    def __call__(self, x: jax.Array, mask: attention.AttentionMask | None) -> jax.Array:
        x = x + self.attn(self.ln_1(x), mask)
        h = _act(self.act, self.c_fc(self.ln_2(x)))
        h = constrain(h, ("act_batch", "act_length", "act_mlp"))
        x = x + self.c_proj(h)
        return constrain(x, ("act_batch", "act_length", "act_embed"))


def _stacked_blocks(cfg: "CLIPConfig", n: int, width: int, heads: int, mlp_dim: int, rngs: nnx.Rngs) -> nnx.Module:
    """``n`` :class:`ResidualBlock` of one tower stacked on a leading ``layers`` axis."""
    return stacked(n, lambda r: ResidualBlock(width, heads, mlp_dim, cfg.hidden_act, cfg.layer_norm_eps, rngs=r,
                                              attention_impl=cfg.attention_impl), rngs)


def _run_blocks(blocks: nnx.Module, x: jax.Array, n: int, mask: attention.AttentionMask | None,
                remat: str = "none") -> jax.Array:
    """Runs the first ``n`` stacked blocks over ``x`` with ``jax.lax.scan`` (``remat``: models/remat.py policy)."""
    graphdef, state = nnx.split(blocks)
    state = jax.tree.map(lambda a: a[:n], state)

    def body(h, st):
        return nnx.merge(graphdef, st)(h, mask), None

    x, _ = jax.lax.scan(remat_lib.remat(body, remat), x, state)
    return x


def _cubic_weights(t: np.ndarray, a: float = -0.75) -> np.ndarray:
    """torch ``upsample_bicubic2d`` weights for taps -1, 0, 1, 2 at fractional offsets ``t``."""

    def near(x):  # |x| <= 1
        return ((a + 2) * x - (a + 3)) * x * x + 1

    def far(x):  # 1 < |x| < 2
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a

    return np.stack([far(t + 1), near(t), near(1 - t), far(2 - t)], -1)


@functools.lru_cache(maxsize=32)
def kornia_resize_matrix(n_in: int, n_out: int) -> np.ndarray:
    """(n_out, n_in) float32 matrix of kornia's antialiased bicubic resize along one axis.

    = bicubic(align_corners=True, a=-0.75, clamped) @ gaussian_blur(reflect); see the module
    docstring for the constants (kornia ``geometry.transform.resize``).
    """
    sigma = max((n_in / n_out - 1.0) / 2.0, 0.001)
    ks = int(max(2.0 * 2 * sigma, 3))
    ks += 1 - ks % 2
    x = np.arange(ks, dtype=np.float64) - ks // 2
    g = np.exp(-(x**2) / (2 * sigma**2))
    g /= g.sum()
    front = (ks - 1) // 2
    if front >= n_in:
        raise ValueError(f"kornia resize {n_in}->{n_out}: blur kernel {ks} too wide for reflect padding")
    blur = np.zeros((n_in, n_in))
    for i in range(n_in):
        for j in range(ks):
            p = i - front + j
            p = -p if p < 0 else (2 * (n_in - 1) - p if p > n_in - 1 else p)
            blur[i, p] += g[j]
    scale = (n_in - 1) / (n_out - 1) if n_out > 1 else 0.0
    src = np.arange(n_out) * scale
    i0 = np.floor(src).astype(np.int64)
    w = _cubic_weights(src - i0)
    interp = np.zeros((n_out, n_in))
    for tap in range(4):
        np.add.at(interp, (np.arange(n_out), np.clip(i0 - 1 + tap, 0, n_in - 1)), w[:, tap])
    return (interp @ blur).astype(np.float32)


def resize(images: jax.Array, size: int, method: str = "kornia") -> jax.Array:
    """Square antialiased bicubic resize of [B, h, w, C] float images to [B, size, size, C] fp32.

    ``method``: ``"kornia"`` (the release's resize, exact) or ``"jax"`` (``jax.image.resize``
    bicubic antialias); see the module docstring.
    """
    x = images.astype(jnp.float32)
    b, h, w, c = x.shape
    if method == "kornia":
        # Two plain 2-D GEMMs (width, then height), their transposed operands kept apart by optimization
        # barriers: XLA:GPU fuses the einsum's transposes into a Triton GEMM it cannot tile ("Couldn't
        # find output tile sizes", jax 0.10.2, any batch or frame size), so a1/a2/b/c failed to compile
        # for GPUs. The same products in the same order as the einsum (bit-identical on XLA:CPU).
        mh = jnp.asarray(kornia_resize_matrix(h, size))
        mw = jnp.asarray(kornia_resize_matrix(w, size))
        hi = jax.lax.Precision.HIGHEST
        rows = jax.lax.optimization_barrier(jnp.moveaxis(x, 2, 3).reshape(b * h * c, w))
        y = jnp.dot(rows, mw.T, precision=hi).reshape(b, h, c, size)  # [B, h, C, size(w)]
        cols = jax.lax.optimization_barrier(jnp.moveaxis(y, 1, 3).reshape(b * c * size, h))
        z = jnp.dot(cols, mh.T, precision=hi).reshape(b, c, size, size)  # [B, C, size(w), size(h)]
        return jnp.transpose(z, (0, 3, 2, 1))
    if method == "jax":
        return jax.image.resize(x, (b, size, size, c), method="bicubic", antialias=True)
    raise ValueError(f"resize method must be 'kornia' or 'jax', got {method!r}")


def preprocess(images: jax.Array, image_size: int = 224, resize_method: str = "kornia") -> jax.Array:
    """The release's CLIP preprocessing of the reference frame (docs/encoders.md#clip-image-tower).

    Args:
      images: [B, h, w, 3] float in [-1, 1] (any h, w; the release feeds 480 x 720).
      image_size: output side (224 for ViT-B/16).
      resize_method: ``"kornia"`` (release, default) or ``"jax"``; see :func:`resize`.

    Returns:
      [B, image_size, image_size, 3] float32: antialiased bicubic resize straight to a square
      (no crop, no aspect preservation), then ``(x + 1) / 2`` and CLIP mean/std normalization.
    """
    x = resize(images, image_size, resize_method)
    x = (x + 1.0) / 2.0
    return (x - jnp.asarray(CLIP_MEAN, jnp.float32)) / jnp.asarray(CLIP_STD, jnp.float32)


class CLIPVisionTransformer(nnx.Module):
    """open_clip ``VisionTransformer`` (``visual``), without the projection (kept in :class:`CLIP`).

    Params: ``conv1`` [p, p, 3, D] no bias; ``class_embedding`` [D]; ``positional_embedding``
    [1 + P, D]; ``ln_pre``; ``blocks`` stacked [vision_layers, ...]; ``ln_post``.
    """

    def __init__(self, cfg: CLIPConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        d, p = cfg.vision_width, cfg.patch_size
        self.conv1 = _param(rngs, _normal, (p, p, 3, d), (None, None, "conv_in", "embed"))
        self.class_embedding = _param(rngs, _normal, (d,), ("embed",))
        self.positional_embedding = _param(rngs, _normal, (cfg.num_patches + 1, d), (None, "embed"))
        self.ln_pre = LayerNorm(d, cfg.layer_norm_eps, rngs=rngs)
        self.blocks = _stacked_blocks(cfg, cfg.vision_layers, d, cfg.vision_heads, cfg.vision_mlp_dim, rngs)
        self.ln_post = LayerNorm(d, cfg.layer_norm_eps, rngs=rngs)

    def embed(self, pixels: jax.Array) -> jax.Array:
        """pixels: [B, image_size, image_size, 3] normalized (output of :func:`preprocess`). Returns
        [B, 1 + P, D] after ln_pre."""
        cfg = self.cfg
        dt = jnp.dtype(cfg.dtype)
        b, h, w, c = pixels.shape
        if (h, w) != (cfg.image_size, cfg.image_size):
            raise ValueError(f"CLIP expects {cfg.image_size}x{cfg.image_size} pixels, got {h}x{w}; call preprocess()")
        p, g = cfg.patch_size, cfg.grid
        x = pixels.astype(dt).reshape(b, g, p, g, p, c).transpose(0, 1, 3, 2, 4, 5).reshape(b, g * g, p * p * c)
        x = x @ self.conv1[...].astype(dt).reshape(p * p * c, -1)
        cls = jnp.broadcast_to(self.class_embedding[...].astype(dt), (b, 1, x.shape[-1]))
        x = jnp.concatenate([cls, x], axis=1) + self.positional_embedding[...].astype(dt)
        x = constrain(x, ("act_batch", "act_length", "act_embed"))
        return self.ln_pre(x)

    def __call__(self, pixels: jax.Array, num_layers: int | None = None) -> jax.Array:
        """Hidden states [B, 1 + P, D] after the first ``num_layers`` blocks (default all), no ln_post."""
        n = self.cfg.vision_layers if num_layers is None else num_layers
        if not 0 <= n <= self.cfg.vision_layers:
            raise ValueError(f"num_layers {n} outside [0, {self.cfg.vision_layers}]")
        return _run_blocks(self.blocks, self.embed(pixels), n, None, self.cfg.remat)

    def patch_tokens(self, pixels: jax.Array) -> jax.Array:
        """f_v: penultimate-block patch tokens without CLS and without ln_post, [B, P, D]
        (docs/encoders.md#clip-image-tower)."""
        return self(pixels, self.cfg.vision_layers - 1)[:, 1:]

    def encode_reference(self, images: jax.Array, resize_method: str = "kornia") -> jax.Array:
        """f_v from raw frames: [B, h, w, 3] in [-1, 1] -> [B, P, D] (preprocess + patch_tokens)."""
        return self.patch_tokens(preprocess(images, self.cfg.image_size, resize_method))

    def pooled(self, pixels: jax.Array) -> jax.Array:
        """ln_post of the final CLS token, [B, D] (HF ``pooler_output``)."""
        return self.ln_post(self(pixels)[:, 0])


class CLIPTextTransformer(nnx.Module):
    """open_clip text tower: ``token_embedding`` [V, D], ``positional_embedding``
    [text_context_length, D], causal blocks, ``ln_final``."""

    def __init__(self, cfg: CLIPConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        d = cfg.text_width
        self.token_embedding = _param(rngs, _normal, (cfg.text_vocab_size, d), ("vocab", "embed"))
        self.positional_embedding = _param(rngs, _normal, (cfg.text_context_length, d), (None, "embed"))
        self.blocks = _stacked_blocks(cfg, cfg.text_layers, d, cfg.text_heads, cfg.text_mlp_dim, rngs)
        self.ln_final = LayerNorm(d, cfg.layer_norm_eps, rngs=rngs)

    def __call__(self, ids: jax.Array) -> jax.Array:
        """ids: int32 [B, L], L <= context length. Returns [B, L, D] after ln_final."""
        dt = jnp.dtype(self.cfg.dtype)
        length = ids.shape[1]
        if length > self.cfg.text_context_length:
            raise ValueError(f"text length {length} > context length {self.cfg.text_context_length}")
        x = self.token_embedding[...].astype(dt)[ids] + self.positional_embedding[...].astype(dt)[:length]
        x = _run_blocks(self.blocks, x, self.cfg.text_layers, attention.causal_mask(), self.cfg.remat)
        return self.ln_final(x)

    def pooled(self, ids: jax.Array) -> jax.Array:
        """Hidden state at the EOT token, [B, D] (see :class:`CLIPConfig` ``eot_token_id``)."""
        x = self(ids)
        if self.cfg.eot_token_id is None:
            pos = jnp.argmax(ids, axis=-1)
        else:
            pos = jnp.argmax(ids == self.cfg.eot_token_id, axis=-1)
        return x[jnp.arange(x.shape[0]), pos]


class CLIP(nnx.Module):
    """Full CLIP (both towers and projections) for the CLIP-I / CLIP-T metrics (docs/evaluation.md).

    ``visual_projection`` (Dv, E) and ``text_projection`` (Dt, E) multiply from the right
    (open_clip ``proj`` layout); ``logit_scale`` is the log temperature.
    """

    def __init__(self, cfg: CLIPConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.visual = CLIPVisionTransformer(cfg, rngs=rngs)
        self.text = CLIPTextTransformer(cfg, rngs=rngs)
        self.visual_projection = _param(rngs, _normal, (cfg.vision_width, cfg.embed_dim), ("embed", None))
        self.text_projection = _param(rngs, _normal, (cfg.text_width, cfg.embed_dim), ("embed", None))
        self.logit_scale = nnx.Param(jnp.asarray(jnp.log(1 / 0.07), jnp.float32))

    @classmethod
    def from_config(cls, cfg: Any, *, rngs: nnx.Rngs) -> "CLIP":
        return cls(CLIPConfig.from_config(cfg), rngs=rngs)

    def encode_image(self, pixels: jax.Array, normalize: bool = False) -> jax.Array:
        """pixels: [B, image_size, image_size, 3] preprocessed. Returns image embeddings [B, E] in fp32."""
        e = (self.visual.pooled(pixels) @ self.visual_projection[...].astype(pixels.dtype)).astype(jnp.float32)
        return e / jnp.linalg.norm(e, axis=-1, keepdims=True) if normalize else e

    def encode_text(self, ids: jax.Array, normalize: bool = False) -> jax.Array:
        """ids: int32 [B, L] with an EOT token. Returns text embeddings [B, E] in fp32."""
        h = self.text.pooled(ids)
        e = (h @ self.text_projection[...].astype(h.dtype)).astype(jnp.float32)
        return e / jnp.linalg.norm(e, axis=-1, keepdims=True) if normalize else e

    def __call__(self, pixels: jax.Array, ids: jax.Array) -> jax.Array:
        """Image-text logits (B_img, B_txt) = exp(logit_scale) * cos similarities."""
        i = self.encode_image(pixels, normalize=True)
        t = self.encode_text(ids, normalize=True)
        return jnp.exp(self.logit_scale[...]) * i @ t.T
