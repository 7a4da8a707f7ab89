"""CogVideoX-2B diffusion transformer with AnimeGamer conditioning (the decoder D_a), Flax NNX.

Follows the SAT implementation used by AnimeGamer (`VDM_Decoder/dit_video_concat.py`) and is
weight-compatible with diffusers `CogVideoXTransformer3DModel` (sin-cos, non-RoPE variant); facts in
docs/dit.md (numbers, block, output, LoRA) and docs/dit.md#checkpoint-keys (parameter names).

Architectural notes not obvious from the reference:
  * The 226 conditioning tokens are the action-aware representation s_a [B, 226, 1920] itself
    (paths 2 and 3 of docs/dit.md#conditioning-paths). There is no text projection inside this module: diffusers'
    `patch_embed.text_proj` and AnimeGamer's E_a (`text_proj`/`ip_proj`/mix LayerNorms) live outside,
    in the shot encoder.
  * The motion scope ("flow") enters as `flow_embed(sinusoid(flow))` added to the timestep embedding
    (docs/dit.md#timestep-and-flow-embedding); its last Linear is zero-initialized, so an untrained
    flow branch is exactly a no-op.
  * Expert adaLN: one Linear(time_embed_dim -> 12*D) per block gives separate shift/scale/gate for the
    conditioning tokens and for the video tokens (docs/dit.md#block); stored as [num_layers, E, 12, D] in SAT
    chunk order (shapes: docs/design.md#dimension-letters).
  * LayerNorm eps: block norms and `final_layernorm` use `norm_eps` (1e-5, SAT default), q/k norms use
    `qk_norm_eps` (1e-6); the final-layer norm uses `final_norm_eps` (SAT 1e-6, diffusers 1e-5).
  * LoRA with SAT `lora2` semantics (docs/dit.md#lora): separate A/B for q, k and v and for the output projection,
    `out = W x + b + (alpha / r) * B A x`, through the one LoRA module (models/layers.py `LoRAEinsum`,
    `LoRAParam`); `merge_lora` folds it into the base weights for inference.
  * `DiTBlock` is an NNX module (submodules named after diffusers' `CogVideoXBlock`: norm1, norm2,
    attn1.{to_q,to_k,to_v,norm_q,norm_k,to_out}, ff.{proj_in,proj_out}, plus the 12-chunk `adaln`);
    the model creates `num_layers` of them with `nnx.vmap` (leading "layers" axis on every parameter)
    and scans them (`jax.lax.scan` over the split block state, as Mistral, CLIP and T5 do) under a
    named remat policy (models/remat.py), so compile time does not grow with depth.
  * Norms, softmax and the sinusoids are computed in float32 whatever the activation dtype.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import einops
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from animegamer_jax.models import attention
from animegamer_jax.models import remat as remat_lib
from animegamer_jax.models.common import param as _param
from animegamer_jax.models.layers import LayerNorm, LoRAEinsum, layer_norm, stacked
from animegamer_jax.models.layers import merge_lora as merge_lora_in_place
from animegamer_jax.parallel import constrain

Array = jax.Array

BATCH_SEQ_EMBED = ("act_batch", "act_length", "act_embed")
#: a student's guidance scale w (about 1..10) is embedded as ``timestep_sinusoid(GUIDANCE_EMBED_SCALE * w)``
#: so that it spans a range of the sinusoid's frequencies like the DDPM timesteps do (LCM embeds 1000 w)
GUIDANCE_EMBED_SCALE = 100.0
BATCH_SEQ_HEADS = ("act_batch", "act_length", "act_heads", None)


@dataclasses.dataclass(frozen=True)
class DiTConfig:
    """Sizes and numerics of the DiT (docs/dit.md#numbers; defaults are CogVideoX-2B / AnimeGamer).

    Attributes:
      hidden_size: model width D (1920).
      num_layers: transformer blocks (30).
      num_heads: attention heads N (30).
      head_dim: per-head width (64); num_heads * head_dim must equal hidden_size.
      mlp_ratio: MLP inner width / D (4.0, GELU tanh).
      time_embed_dim: width E of the timestep / flow embedding (512).
      in_channels / out_channels: latent channels (16 / 16).
      patch_size: spatial patch p (2); no patching in time.
      text_length: number of conditioning tokens (226 = 30 text + 196 image).
      spatial_interpolation_scale / temporal_interpolation_scale: 3-D sin-cos scales (1.875 / 1.0).
      norm_eps: block LayerNorms and `final_layernorm` (1e-5).
      qk_norm_eps: q/k LayerNorms (1e-6).
      final_norm_eps: final-layer `norm_final` (SAT 1e-6; diffusers uses 1e-5).
      lora_rank: LoRA rank r on q/k/v/out (64); 0 builds no LoRA parameters.
      lora_alpha: LoRA alpha; scaling = alpha / r (SAT lora2 default alpha 1 -> 1/64, docs/dit.md#lora).
      use_flow: build the motion-scope embedding (AnimeGamer); False gives plain CogVideoX.
      use_guidance: build the guidance-scale embedding of a distilled student
        (docs/training.md#phase-d-distillation): ``guidance_embed(sinusoid(GUIDANCE_EMBED_SCALE * w))``
        is added to the timestep embedding; zero-initialized like ``flow_embed``, so a student built
        from the teacher's weights starts as the teacher.
      dtype: activation dtype name ("float32" / "bfloat16").
      param_dtype: parameter dtype name.
      remat: remat policy of the block scan, one of models/remat.py `REMAT_POLICIES` ("none",
        "full", "save_dots", "offload_dots"); booleans of older configs map to "full" / "none".
      attention_impl: kernel of :func:`animegamer_jax.models.attention.dot_product_attention`
        ("auto" picks by the target devices and size; no parameters depend on it).
    """

    hidden_size: int = 1920
    num_layers: int = 30
    num_heads: int = 30
    head_dim: int = 64
    mlp_ratio: float = 4.0
    time_embed_dim: int = 512
    in_channels: int = 16
    out_channels: int = 16
    patch_size: int = 2
    text_length: int = 226
    spatial_interpolation_scale: float = 1.875
    temporal_interpolation_scale: float = 1.0
    norm_eps: float = 1e-5
    qk_norm_eps: float = 1e-6
    final_norm_eps: float = 1e-6
    lora_rank: int = 64
    lora_alpha: float = 1.0
    use_flow: bool = True
    use_guidance: bool = False
    dtype: str = "float32"
    param_dtype: str = "float32"
    remat: str = "none"
    attention_impl: str = "auto"

    def __post_init__(self):
        object.__setattr__(self, "remat", remat_lib.policy_name(self.remat))

    @property
    def mlp_dim(self) -> int:
        return int(self.hidden_size * self.mlp_ratio)

    @property
    def lora_scaling(self) -> float:
        return self.lora_alpha / self.lora_rank if self.lora_rank else 0.0

    @classmethod
    def from_config(cls, dit: Any, text_length: int | None = None) -> "DiTConfig":
        """Builds the config from the `dit` ConfigDict section (configs/animegamer_2b_7b.py).

        Args:
          dit: the `cfg.dit` section.
          text_length: conditioning tokens; default `dit.text_length`.
        """
        get = lambda k, d: dit.get(k, d) if hasattr(dit, "get") else getattr(dit, k, d)  # noqa: E731
        return cls(
            hidden_size=get("hidden_size", 1920),
            num_layers=get("num_layers", 30),
            num_heads=get("num_heads", 30),
            head_dim=get("head_dim", 64),
            mlp_ratio=get("mlp_ratio", 4.0),
            time_embed_dim=get("time_embed_dim", 512),
            in_channels=get("in_channels", 16),
            out_channels=get("out_channels", 16),
            patch_size=get("patch_size", 2),
            text_length=text_length if text_length is not None else get("text_length", 226),
            spatial_interpolation_scale=get("spatial_interpolation_scale", 1.875),
            temporal_interpolation_scale=get("temporal_interpolation_scale", 1.0),
            norm_eps=get("norm_eps", 1e-5),
            qk_norm_eps=get("qk_norm_eps", 1e-6),
            final_norm_eps=get("final_norm_eps", 1e-6),
            lora_rank=get("lora_rank", 64),
            lora_alpha=get("lora_alpha", 1.0),
            use_flow=get("use_flow", True),
            use_guidance=get("use_guidance", False),
            dtype=get("dtype", "float32"),
            param_dtype=get("param_dtype", "float32"),
            remat=get("remat", "none"),
            attention_impl=get("attention_impl", "auto"),
        )


def _fan_in_normal(fan_in: int) -> Any:
    return nnx.initializers.normal(stddev=1.0 / math.sqrt(fan_in))


_zeros = nnx.initializers.zeros_init()
_ones = nnx.initializers.ones_init()


def timestep_sinusoid(t: Array, dim: int, max_period: float = 10000.0) -> Array:
    """Sinusoidal embedding `concat(cos(t f), sin(t f))`, cos first (docs/dit.md#timestep-and-flow-embedding).

    Args:
      t: [B] timesteps (integer DDPM index) or flow values (raw float), any numeric dtype.
      dim: even output width (the model width D).

    Returns:
      float32 [B, dim] with `f_i = exp(-ln(max_period) i / (dim/2))` (diffusers `Timesteps(flip_sin_to_cos=True,
      downscale_freq_shift=0)`, SAT `timestep_embedding`).
    """
    half = dim // 2
    freqs = jnp.exp(-math.log(max_period) * jnp.arange(half, dtype=jnp.float32) / half)
    args = t.astype(jnp.float32)[:, None] * freqs[None]
    return jnp.concatenate([jnp.cos(args), jnp.sin(args)], axis=-1)


def _sincos_1d(dim: int, pos: np.ndarray) -> np.ndarray:
    omega = 1.0 / 10000 ** (np.arange(dim // 2, dtype=np.float64) / (dim / 2.0))
    out = np.outer(pos.reshape(-1), omega)
    return np.concatenate([np.sin(out), np.cos(out)], axis=1)


def sincos_pos_embed_3d(dim: int, frames: int, height: int, width: int, spatial_scale: float,
                        temporal_scale: float) -> np.ndarray:
    """Fixed 3-D sin-cos position table for the video tokens (docs/dit.md#input-sequence).

    Args:
      dim: model width D (divisible by 16).
      frames, height, width: token grid (latent frames t, h/p, w/p).
      spatial_scale / temporal_scale: interpolation scales (1.875 / 1.0).

    Returns:
      float64 [frames*height*width, D], tokens in (t, h, w) row-major order; each row is
      `concat(temporal[D/4], emb1d(3D/8, w/scale), emb1d(3D/8, h/scale))` (diffusers
      `get_3d_sincos_pos_embed`; the w coordinate comes first, from meshgrid(w, h)).
    """
    if dim % 16:
        raise ValueError(f"3-D sin-cos needs a width divisible by 16, got {dim}")
    dt, ds = dim // 4, 3 * dim // 4
    gw, gh = np.meshgrid(np.arange(width) / spatial_scale, np.arange(height) / spatial_scale)
    spatial = np.concatenate([_sincos_1d(ds // 2, gw), _sincos_1d(ds // 2, gh)], axis=1)  # [height*width, ds]
    temporal = _sincos_1d(dt, np.arange(frames) / temporal_scale)  # [frames, dt]
    table = np.concatenate(
        [np.repeat(temporal[:, None], height * width, axis=1),
         np.repeat(spatial[None], frames, axis=0)], axis=-1)
    return table.reshape(frames * height * width, dim)


class MLPEmbedder(nnx.Module):
    """Linear(D -> E), SiLU, Linear(E -> E) (SAT `time_embed` / `flow_embed`, diffusers `TimestepEmbedding`)."""

    def __init__(self, in_dim: int, out_dim: int, *, zero_out: bool, param_dtype: Any, rngs: nnx.Rngs):
        k1, k2 = jax.random.split(rngs.params())
        self.linear_1_kernel = _param(k1, _fan_in_normal(in_dim), (in_dim, out_dim), ("embed", None), param_dtype)
        self.linear_1_bias = _param(k1, _zeros, (out_dim,), (None,), param_dtype)
        init2 = _zeros if zero_out else _fan_in_normal(out_dim)
        self.linear_2_kernel = _param(k2, init2, (out_dim, out_dim), (None, None), param_dtype)
        self.linear_2_bias = _param(k2, _zeros, (out_dim,), (None,), param_dtype)

    def __call__(self, x: Array) -> Array:
        """x: [B, in_dim] -> [B, out_dim] in x's dtype."""
        dt = x.dtype
        h = x @ self.linear_1_kernel[...].astype(dt) + self.linear_1_bias[...].astype(dt)
        h = jax.nn.silu(h)
        return h @ self.linear_2_kernel[...].astype(dt) + self.linear_2_bias[...].astype(dt)


def _dense(cfg: DiTConfig, ins: tuple[int, ...], outs: tuple[int, ...], in_axes: tuple[str, ...],
           out_axes: tuple[str, ...], *, rngs: nnx.Rngs, lora: bool = False) -> LoRAEinsum:
    """A biased projection of the DiT (the one LoRA module, models/layers.py); LoRA only where `lora`."""
    return LoRAEinsum(ins, outs, in_axes=in_axes, out_axes=out_axes, rank=cfg.lora_rank if lora else 0,
                      alpha=cfg.lora_alpha, use_bias=True, dtype=jnp.dtype(cfg.dtype),
                      param_dtype=jnp.dtype(cfg.param_dtype), kernel_init=_fan_in_normal(math.prod(ins)),
                      rngs=rngs)


class Attention(nnx.Module):
    """Joint full attention with q/k LayerNorm (diffusers `attn1`, SAT `attention` + q/k layernorm lists).

    Parameters: `to_q`/`to_k`/`to_v.kernel` [D, N, H], `.bias` [N, H]; `norm_q`/`norm_k` scale/bias [H];
    `to_out.kernel` [N, H, D], `.bias` [D]; with LoRA rank r > 0 (SAT lora2, one A/B per q, k, v and
    dense; docs/dit.md#lora) `to_q.lora_a` [D, r], `to_q.lora_b` [r, N, H], `to_out.lora_a` [N, H, r],
    `to_out.lora_b` [r, D].
    """

    def __init__(self, cfg: DiTConfig, *, rngs: nnx.Rngs):
        D, N, H = cfg.hidden_size, cfg.num_heads, cfg.head_dim
        heads = ("heads", "head_dim")
        self.to_q = _dense(cfg, (D,), (N, H), ("embed",), heads, rngs=rngs, lora=True)
        self.to_k = _dense(cfg, (D,), (N, H), ("embed",), heads, rngs=rngs, lora=True)
        self.to_v = _dense(cfg, (D,), (N, H), ("embed",), heads, rngs=rngs, lora=True)
        self.norm_q = LayerNorm(H, cfg.qk_norm_eps, param_dtype=jnp.dtype(cfg.param_dtype))
        self.norm_k = LayerNorm(H, cfg.qk_norm_eps, param_dtype=jnp.dtype(cfg.param_dtype))
        self.to_out = _dense(cfg, (N, H), (D,), heads, ("embed",), rngs=rngs, lora=True)
        self.attention_impl = cfg.attention_impl  # static kernel name (no parameters depend on it)

    def __call__(self, h: Array, ref_lora: Any = None) -> Array:
        """h [B, L, D] (conditioning then video tokens) -> [B, L, D]; no mask, scale 1/sqrt(H).
        ``ref_lora``: this layer's reference LoRA (models/cogvideox/reference.py ``ReferenceLoRA``),
        added to q, k, v and out when a reference is given; None leaves the attention as it is."""
        if ref_lora is None:
            q, k, v = self.to_q(h), self.to_k(h), self.to_v(h)
        else:
            q = self.to_q(h) + ref_lora.update("q", h, self.to_q.dtype)
            k = self.to_k(h) + ref_lora.update("k", h, self.to_k.dtype)
            v = self.to_v(h) + ref_lora.update("v", h, self.to_v.dtype)
        q = constrain(self.norm_q(q), BATCH_SEQ_HEADS)
        k = constrain(self.norm_k(k), BATCH_SEQ_HEADS)
        v = constrain(v, BATCH_SEQ_HEADS)
        # Full joint attention, no mask, scale 1/sqrt(head_dim); softmax in float32. With a `context`
        # mesh axis the joint sequence stays sharded (K/V all-gathered per layer).
        o = attention.context_parallel_attention(q, k, v, implementation=self.attention_impl)
        o = constrain(o, BATCH_SEQ_HEADS)
        out = self.to_out(o)
        if ref_lora is not None:
            out = out + ref_lora.update("out", o, self.to_out.dtype)
        return constrain(out, BATCH_SEQ_EMBED)


class FeedForward(nnx.Module):
    """Linear(D -> F), GELU (tanh), Linear(F -> D) (diffusers `ff.net.0.proj` / `ff.net.2`, SAT `mlp`)."""

    def __init__(self, cfg: DiTConfig, *, rngs: nnx.Rngs):
        D, F = cfg.hidden_size, cfg.mlp_dim
        self.proj_in = _dense(cfg, (D,), (F,), ("embed",), ("mlp",), rngs=rngs)
        self.proj_out = _dense(cfg, (F,), (D,), ("mlp",), ("embed",), rngs=rngs)

    def __call__(self, h: Array) -> Array:
        """h [B, L, D] -> [B, L, D]."""
        f = constrain(jax.nn.gelu(self.proj_in(h), approximate=True), ("act_batch", "act_length", "act_mlp"))
        return constrain(self.proj_out(f), BATCH_SEQ_EMBED)


class DiTBlock(nnx.Module):
    """One CogVideoX block on the split streams (docs/dit.md#block; diffusers `CogVideoXBlock`).

    Parameters (D width, E time_embed_dim): `norm1`, `norm2` (scale/bias [D]); `adaln.kernel`
    [E, 12, D], `adaln.bias` [12, D] (expert adaLN, one Linear for both streams, SAT chunk order:
    shift/scale/gate msa, shift/scale/gate mlp for the video tokens, then the same six for the
    conditioning tokens; diffusers splits it over `norm1.linear` / `norm2.linear`); `attn1`
    (:class:`Attention`); `ff` (:class:`FeedForward`). The model creates `num_layers` of these with
    `nnx.vmap` (leading "layers" axis on every parameter) and scans them.
    """

    def __init__(self, cfg: DiTConfig, *, rngs: nnx.Rngs):
        D, N, H, E = cfg.hidden_size, cfg.num_heads, cfg.head_dim, cfg.time_embed_dim
        if N * H != D:
            raise ValueError(f"num_heads * head_dim = {N * H} must equal hidden_size {D}")
        pd = jnp.dtype(cfg.param_dtype)
        self.norm1 = LayerNorm(D, cfg.norm_eps, param_dtype=pd)
        self.norm2 = LayerNorm(D, cfg.norm_eps, param_dtype=pd)
        # SAT's `reinit` would zero the adaLN Linear; it is not called at construction, so small random.
        self.adaln = _dense(cfg, (E,), (12, D), (None,), (None, "embed"), rngs=rngs)
        self.attn1 = Attention(cfg, rngs=rngs)
        self.ff = FeedForward(cfg, rngs=rngs)

    def __call__(self, txt: Array, img: Array, emb: Array, ref_lora: Any = None) -> tuple[Array, Array]:
        """txt [B, Lt, D] conditioning tokens, img [B, Lv, D] video tokens (with a reference: its
        tokens at the end), emb [B, E] time (+flow) embedding (activation dtype), ``ref_lora`` the
        layer's reference LoRA or None (:meth:`Attention.__call__`) -> updated (txt, img)."""
        lt = txt.shape[1]
        # [B, 12, D], laid out like activations (D whole) however the adaLN kernel is sharded
        mod = constrain(self.adaln(jax.nn.silu(emb)), ("act_batch", None, "act_embed"))
        m = [mod[:, i][:, None, :] for i in range(12)]

        def modulate(norm: LayerNorm, x: Array, shift: Array, scale: Array) -> Array:
            return norm(x) * (1 + scale) + shift

        h = jnp.concatenate([modulate(self.norm1, txt, m[6], m[7]), modulate(self.norm1, img, m[0], m[1])], axis=1)
        out = self.attn1(constrain(h, BATCH_SEQ_EMBED), ref_lora)
        txt = txt + m[8] * out[:, :lt]
        img = img + m[2] * out[:, lt:]
        h = jnp.concatenate([modulate(self.norm2, txt, m[9], m[10]), modulate(self.norm2, img, m[3], m[4])], axis=1)
        f = self.ff(constrain(h, BATCH_SEQ_EMBED))
        txt = txt + m[11] * f[:, :lt]
        img = img + m[5] * f[:, lt:]
        return constrain(txt, BATCH_SEQ_EMBED), constrain(img, BATCH_SEQ_EMBED)


class CogVideoXDiT(nnx.Module):
    """CogVideoX-2B DiT predicting v from noisy latents, s_a conditioning, timestep and motion scope.

    Call: `model(latents, cond, timesteps, flow=None) -> v`
      latents: [B, t, C_in, h, w] noisy latents (DiT layout, scaled by 1.15258426; docs/diffusion.md#latent-scale).
      cond: [B, text_length, D] action-aware representation s_a (or any projected 226-token prefix).
      timesteps: [B] integer DDPM index 0..999 (float accepted; docs/dit.md#timestep-and-flow-embedding).
      flow: [B] float motion-scope value (docs/dit.md#motion-level-to-flow), or None for no flow
        embedding contribution.
      guidance: [B] float DynamicCFG scale w of a distilled student (``use_guidance``), or None.
      reference: [B, 1, C_in, h, w] reference latent (one VAE latent frame of the reference image,
        scaled like ``latents``; models/cogvideox/reference.py ``encode_reference``) or None; needs
        ``adapter``. Its h/p x w/p tokens join the video tokens (docs/dit.md#reference-conditioning)
        and are dropped before the output layer.
      adapter: the ``reference`` component (``ReferenceAdapter``); used only with ``reference``, so
        with ``reference=None`` the output is the DiT's own whatever ``adapter`` is.
    Returns:
      v-prediction [B, t, C_out, h, w] in the activation dtype (docs/dit.md#output, docs/diffusion.md#v-prediction).
    Raises:
      ValueError: wrong conditioning length or width, h or w not divisible by the patch size, or a
        reference of the wrong shape or without an adapter.
    """

    def __init__(self, cfg: DiTConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        D, E, p, pd = cfg.hidden_size, cfg.time_embed_dim, cfg.patch_size, jnp.dtype(cfg.param_dtype)
        kin = cfg.in_channels * p * p
        kout = cfg.out_channels * p * p
        k = iter(jax.random.split(rngs.params(), 16))
        # Patch vector order (c, p, q) equals the flattened Conv2d(k=p, s=p) weight.
        self.patch_kernel = _param(next(k), _fan_in_normal(kin), (kin, D), ("conv_in", "embed"), pd)
        self.patch_bias = _param(next(k), _zeros, (D,), ("embed",), pd)
        self.time_embed = MLPEmbedder(D, E, zero_out=False, param_dtype=pd, rngs=rngs)
        if cfg.use_flow:
            self.flow_embed = MLPEmbedder(D, E, zero_out=True, param_dtype=pd, rngs=rngs)
        if cfg.use_guidance:
            self.guidance_embed = MLPEmbedder(D, E, zero_out=True, param_dtype=pd, rngs=rngs)
        self.blocks = stacked(cfg.num_layers, lambda r: DiTBlock(cfg, rngs=r), nnx.Rngs(params=next(k)))
        self.final_norm_scale = _param(next(k), _ones, (D,), ("norm",), pd)
        self.final_norm_bias = _param(next(k), _zeros, (D,), ("norm",), pd)
        self.out_adaln_kernel = _param(next(k), _fan_in_normal(E), (E, 2, D), (None, None, "embed"), pd)
        self.out_adaln_bias = _param(next(k), _zeros, (2, D), (None, "embed"), pd)
        self.out_norm_scale = _param(next(k), _ones, (D,), ("norm",), pd)
        self.out_norm_bias = _param(next(k), _zeros, (D,), ("norm",), pd)
        self.proj_out_kernel = _param(next(k), _fan_in_normal(D), (D, kout), ("embed", "conv_out"), pd)
        self.proj_out_bias = _param(next(k), _zeros, (kout,), ("conv_out",), pd)

    def embed_time(self, timesteps: Array, flow: Array | None, dtype: Any, guidance: Array | None = None) -> Array:
        """[B] timesteps, [B] flow, [B] guidance scale -> [B, E] conditioning embedding in `dtype`
        (docs/dit.md#timestep-and-flow-embedding; the guidance term only with ``use_guidance``)."""
        D = self.cfg.hidden_size
        emb = self.time_embed(timestep_sinusoid(timesteps, D).astype(dtype))
        if self.cfg.use_flow and flow is not None:
            emb = emb + self.flow_embed(timestep_sinusoid(flow, D).astype(dtype))
        if self.cfg.use_guidance and guidance is not None:
            emb = emb + self.guidance_embed(timestep_sinusoid(GUIDANCE_EMBED_SCALE * guidance, D).astype(dtype))
        return emb

    def __call__(self, latents: Array, cond: Array, timesteps: Array, flow: Array | None = None,
                 guidance: Array | None = None, reference: Array | None = None, adapter: Any = None) -> Array:
        cfg = self.cfg
        dt = jnp.dtype(cfg.dtype)
        B, T, C, Hh, Ww = latents.shape
        p = cfg.patch_size
        if cond.shape[1:] != (cfg.text_length, cfg.hidden_size) or cond.shape[0] != B:
            raise ValueError(f"cond must be [{B}, {cfg.text_length}, {cfg.hidden_size}], got {cond.shape}")
        if Hh % p or Ww % p or C != cfg.in_channels:
            raise ValueError(f"latents {latents.shape}: need C={cfg.in_channels} and H, W divisible by {p}")
        h, w = Hh // p, Ww // p
        timesteps = jnp.broadcast_to(jnp.asarray(timesteps), (B,))
        if flow is not None:
            flow = jnp.broadcast_to(jnp.asarray(flow), (B,))
        if guidance is not None:
            if not cfg.use_guidance:
                raise ValueError("a guidance scale was given to a DiT without use_guidance (a teacher); "
                                 "only a distilled student (phase d) takes one")
            guidance = jnp.broadcast_to(jnp.asarray(guidance, jnp.float32), (B,))
        emb = self.embed_time(timesteps, flow, dt, guidance)

        # einops letters: T = latent frames (t), h, w = the patch grid (latent h / p, w / p)
        x = einops.rearrange(latents.astype(dt), "B T C (h p) (w q) -> B (T h w) (C p q)", p=p, q=p)
        img = x @ self.patch_kernel[...].astype(dt) + self.patch_bias[...].astype(dt)
        pos = sincos_pos_embed_3d(cfg.hidden_size, T, h, w, cfg.spatial_interpolation_scale,
                                  cfg.temporal_interpolation_scale)
        img = constrain(img + jnp.asarray(pos, dt)[None], BATCH_SEQ_EMBED)
        txt = constrain(cond.astype(dt), BATCH_SEQ_EMBED)
        lv = img.shape[1]
        if reference is not None:
            if adapter is None:
                raise ValueError("a reference latent was given without the reference adapter (component "
                                 "'reference', training phase r)")
            if reference.shape != (B, 1, C, Hh, Ww):
                raise ValueError(f"reference must be [{B}, 1, {C}, {Hh}, {Ww}] (one latent frame at the "
                                 f"clip's size), got {reference.shape}")
            r = einops.rearrange(reference.astype(dt), "B T C (h p) (w q) -> B (T h w) (C p q)", p=p, q=p)
            r = r @ self.patch_kernel[...].astype(dt) + self.patch_bias[...].astype(dt)
            r = r + jnp.asarray(pos[:h * w], dt)[None] + adapter.type_embed[...].astype(dt)
            img = constrain(jnp.concatenate([img, r], axis=1), BATCH_SEQ_EMBED)

        # jax.lax.scan over the split block state rather than nnx.scan: the samplers call the DiT inside
        # their own lax loops with the module closed over, where nnx transforms refuse a captured module.
        graphdef, block_state = nnx.split(self.blocks)

        if reference is None:
            def body(carry: tuple[Array, Array], st: nnx.State) -> tuple[tuple[Array, Array], None]:
                return nnx.merge(graphdef, st)(carry[0], carry[1], emb), None

            (txt, img), _ = jax.lax.scan(remat_lib.remat(body, cfg.remat), (txt, img), block_state)
        else:  # the adapter's per-layer LoRA scans alongside the blocks; its tokens are dropped after
            ref_graphdef, ref_state = nnx.split(adapter.lora)

            def ref_body(carry: tuple[Array, Array], st: tuple[nnx.State, nnx.State]
                         ) -> tuple[tuple[Array, Array], None]:
                return nnx.merge(graphdef, st[0])(carry[0], carry[1], emb, nnx.merge(ref_graphdef, st[1])), None

            (txt, img), _ = jax.lax.scan(remat_lib.remat(ref_body, cfg.remat), (txt, img), (block_state, ref_state))
            img = img[:, :lv]

        # The conditioning tokens are dropped after the (per-token) final_layernorm.
        img = layer_norm(img, self.final_norm_scale[...], self.final_norm_bias[...], cfg.norm_eps)
        # C here: the output adaLN's 2 chunks (shift, scale), not channels
        mod = jnp.einsum("BE,ECD->BCD", jax.nn.silu(emb), self.out_adaln_kernel[...].astype(dt))
        mod = constrain(mod + self.out_adaln_bias[...].astype(dt)[None], ("act_batch", None, "act_embed"))
        img = layer_norm(img, self.out_norm_scale[...], self.out_norm_bias[...], cfg.final_norm_eps)
        img = img * (1 + mod[:, 1][:, None]) + mod[:, 0][:, None]
        out = img @ self.proj_out_kernel[...].astype(dt) + self.proj_out_bias[...].astype(dt)
        return einops.rearrange(out, "B (T h w) (C p q) -> B T C (h p) (w q)", T=T, h=h, w=w, p=p, q=p)


def flow_value(motion_level: Any, table: Sequence[float] = (0.5, 2.5, 10.0, 15.0, 40.0), xp: Any = jnp) -> Any:
    """Motion level -> flow value fed to `flow_embed`: the one rule, for play and training
    (docs/dit.md#motion-level-to-flow).

    Source: the release's `cuculate_level` (`inference_Decoder.py`).

    Args:
      motion_level: int or int array of levels; 1..len(table)-1 pick `table[level - 1]`, anything
        else (5, 0, negative, a parse failure encoded as -1) picks the last entry.
      table: `cfg.dit.flow_table` (default: the `inference_Decoder.py` table; app.py's is (0.5, 1, 5, 20, 40)).
      xp: the array module, `jax.numpy` (default, traceable) or `numpy` (host-side batch building).

    Returns:
      float32 array of the level's shape.
    """
    lv = xp.asarray(motion_level).astype(xp.int32)
    tab = xp.asarray(table, dtype=xp.float32)
    n = tab.shape[0]
    ok = (lv >= 1) & (lv <= n - 1)
    return xp.where(ok, tab[xp.clip(lv - 1, 0, n - 1)], tab[-1]).astype(xp.float32)


def merge_lora(model: CogVideoXDiT) -> CogVideoXDiT:
    """Returns a LoRA-free copy of `model` with `W += (alpha/r) A B` folded in (docs/dit.md#lora).

    The result has `lora_rank=0` and gives the same outputs (up to float rounding); use it for
    inference. `model` itself is left unchanged.
    """
    merged_cfg = dataclasses.replace(model.cfg, lora_rank=0)
    graphdef, state = nnx.split(model)
    folded = merge_lora_in_place(nnx.merge(graphdef, jax.tree.map(lambda x: x, state)))
    new = nnx.eval_shape(lambda: CogVideoXDiT(merged_cfg, rngs=nnx.Rngs(0)))
    new_state = nnx.state(new, nnx.Param)
    new_state.replace_by_pure_dict(nnx.state(folded, nnx.Param).to_pure_dict())
    nnx.update(new, new_state)
    return new


def prepare_for_inference(model: CogVideoXDiT, dtype: Any = None) -> CogVideoXDiT:
    """The weights play samples with, prepared once at load: LoRA merged (:func:`merge_lora`, in the
    parameter dtype), then every parameter cast to ``dtype`` (default the activation dtype
    ``cfg.dtype``, bf16 at full size) and remat off. Returns a new module with
    ``lora_rank=0, param_dtype=dtype``; ``model`` is unchanged. Saves the per-step LoRA matmuls and
    fp32 -> bf16 weight casts of every denoising step."""
    dt = jnp.dtype(dtype or model.cfg.dtype)
    merged = merge_lora(model)
    new_cfg = dataclasses.replace(merged.cfg, param_dtype=dt.name, remat="none")
    new = nnx.eval_shape(lambda: CogVideoXDiT(new_cfg, rngs=nnx.Rngs(0)))
    pure = jax.tree.map(lambda a: a.astype(dt) if jnp.issubdtype(a.dtype, jnp.floating) else a,
                        nnx.state(merged, nnx.Param).to_pure_dict())
    new_state = nnx.state(new, nnx.Param)
    new_state.replace_by_pure_dict(pure)
    nnx.update(new, new_state)
    return new


#: DiT parameter names (path parts) trained in each phase besides the LoRA factors, which always train
#: (SAT ``disable_untrainable_params``; docs/training.md#trainable-sets): "warmup" is the release's phase-a1
#: set, "joint" / "adaptation" phases a2 / c. ``adaln`` is the blocks' adaLN (SAT ``adaLN_modulations``),
#: not the final layer's (``out_adaln_*``). ``train.model.trainable_filter`` builds the NNX filters; the
#: shot encoder's E_a parameters belong to that module.
TRAINABLE_SETS: dict[str, tuple[str, ...]] = {
    "warmup": ("flow_embed",),
    "joint": ("flow_embed", "adaln"),
    "adaptation": ("flow_embed", "adaln"),
}
