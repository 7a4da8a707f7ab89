"""Mistral decoder (Mistral-7B v0.1 family) in Flax NNX, with LoRA and a KV cache.

Follows ``transformers.models.mistral.modeling_mistral`` (the reference of AnimeGamer's MLLM,
docs/mllm.md#base-llm): RMSNorm (fp32 statistics), RoPE in the HF "rotate_half" layout
(theta from config), grouped-query attention with scale ``head_dim**-0.5``, optional sliding
window (key j visible from query i iff ``j <= i`` and ``i - j < sliding_window``, as HF's
``sliding_window_overlay``), SwiGLU MLP, no biases, untied ``lm_head``.

Layout notes (not obvious from the reference):
  * Layers are created stacked with ``nnx.vmap`` (leading ``"layers"`` axis on every parameter)
    and run with ``jax.lax.scan`` over the split layer state.
  * Projections keep head axes: ``q_proj.kernel`` is ``[D, N, H]`` ("BLD,DNH->BLNH"),
    ``o_proj.kernel`` ``[N, H, D]``, ``gate/up`` ``[D, F]``, ``down`` ``[F, D]``,
    ``embed_tokens`` ``[V, D]``, ``lm_head`` ``[D, V]`` (HF weights transposed by the converter).
  * Attention goes through the project's one entry point
    (:func:`animegamer_jax.models.attention.dot_product_attention`); the ``attention_impl`` config
    field picks the kernel (``attention.IMPLEMENTATIONS``; None / "auto" = by the target devices and size).
    Masks are :class:`~animegamer_jax.models.attention.AttentionMask` position rules, so the
    blockwise and flash kernels never build an ``L x S`` mask.

KV cache (:class:`KVCache`): ``k``, ``v``: ``[num_layers, B, S_max, K, H]`` in the compute dtype,
``length``: int32 scalar, number of filled positions (= next write index, shared by the batch).
The buffer is linear (not a ring): the sliding window is applied through the mask, so any
``S_max`` >= prompt + generated tokens works and decoding across the window length is exact.
Prefill writes positions ``[length, length + L)``; a decode step writes one position. With
``cache_slots`` (int [B, L]) the new keys/values are scattered to those slots instead and the
caller's :class:`~animegamer_jax.models.attention.AttentionMask` says which slots hold which
positions (``k_pos``, ``kv_valid``): the MLLM's turn-granular rolling buffer (inference/mllm_turn.py).

Shapes (docs/design.md#dimension-letters): B batch, L query length, S key length, D model width,
N query heads, K kv heads, H head dim, F MLP width, V vocab.
"""

from __future__ import annotations

import dataclasses
import functools
import weakref
from collections.abc import Callable
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
from flax import nnx

from animegamer_jax.models import remat as remat_lib
from animegamer_jax.models import attention as attn
from animegamer_jax.models.layers import LoRAEinsum, RMSNorm
from animegamer_jax.parallel import mesh as pmesh
from animegamer_jax.parallel import target

ALL_LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _dtype(x: Any) -> Any:
    return jnp.dtype(x) if isinstance(x, str) else x


@dataclasses.dataclass(frozen=True)
class MistralConfig:
    """Static hyper-parameters (field meanings: configs/animegamer_2b_7b.py, ``mllm`` section).

    ``sliding_window`` 0 or None means full causal attention. ``lora_rank`` 0 disables LoRA.
    """

    vocab_size: int = 32284
    hidden_size: int = 4096
    intermediate_size: int = 14336
    num_layers: int = 32
    num_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    sliding_window: int | None = 4096
    dtype: Any = "bfloat16"
    param_dtype: Any = "bfloat16"
    lora_rank: int = 0
    lora_alpha: float = 1.0
    lora_dropout: float = 0.0
    lora_targets: tuple[str, ...] = ALL_LORA_TARGETS
    remat: str = "none"  # models/remat.py policy of the layer scan
    attention_impl: str | None = None
    # prefill / decode_step / greedy_generate: "scan" the stacked layers, or "unstacked": a loop over
    # per-layer weight arrays split once per model (XLA:CPU copies each scanned layer's weight
    # slice before its dots, once per generated token); "auto": unstacked
    # on CPU, scan elsewhere (GPU/TPU fuse the slices). Training and __call__ always scan.
    decode_layers: str = "auto"

    def __post_init__(self):
        object.__setattr__(self, "remat", remat_lib.policy_name(self.remat))

    @classmethod
    def from_config(cls, c: Any, **overrides: Any) -> "MistralConfig":
        """Builds the config from a ``cfg.mllm`` ConfigDict (missing optional fields keep defaults)."""
        names = {f.name for f in dataclasses.fields(cls)}
        kw = {k: c[k] for k in names if k in c}
        if "lora_targets" in kw:
            kw["lora_targets"] = tuple(kw["lora_targets"])
        if kw.get("attention_impl") in ("auto", ""):
            kw["attention_impl"] = None
        kw.update(overrides)
        return cls(**kw)

    @property
    def window(self) -> int | None:
        return int(self.sliding_window) if self.sliding_window else None


@flax.struct.dataclass
class KVCache:
    """Per-layer keys/values. k, v: [num_layers, B, S_max, K, H]; length: int32 [] filled positions."""

    k: jax.Array
    v: jax.Array
    length: jax.Array

    @classmethod
    def init(cls, cfg: MistralConfig, batch: int, max_len: int, dtype: Any = None) -> "KVCache":
        """Zeroed cache for ``batch`` sequences of up to ``max_len`` tokens (dtype: cfg.dtype)."""
        dt = _dtype(dtype or cfg.dtype)
        shape = (cfg.num_layers, batch, max_len, cfg.num_kv_heads, cfg.head_dim)
        return cls(jnp.zeros(shape, dt), jnp.zeros(shape, dt), jnp.zeros((), jnp.int32))


@flax.struct.dataclass
class MistralOutput:
    """logits: [B, L, V] float32 (None when not requested); hidden: [B, L, D] after the final
    RMSNorm (HF ``hidden_states[-1]``); cache: the updated :class:`KVCache` or None."""

    logits: jax.Array | None
    hidden: jax.Array
    cache: KVCache | None


def _rms_norm(dim: int, eps: float, param_dtype: Any) -> RMSNorm:
    """HF MistralRMSNorm: the one RMSNorm with HF's weight name and its cast before the weight multiply."""
    return RMSNorm(dim, eps, param_name="weight", cast_first=True, param_dtype=param_dtype)


def rope(x: jax.Array, positions: jax.Array, theta: float) -> jax.Array:
    """Rotary embedding, HF rotate_half layout. x: [B, L, N, H]; positions: [B, L] int."""
    h = x.shape[-1]
    inv_freq = 1.0 / (theta ** (jnp.arange(0, h, 2, dtype=jnp.float32) / h))
    freqs = positions.astype(jnp.float32)[..., None] * inv_freq  # [B, L, H/2]
    emb = jnp.concatenate([freqs, freqs], axis=-1)[:, :, None, :]
    cos, sin = jnp.cos(emb), jnp.sin(emb)
    xf = x.astype(jnp.float32)
    x1, x2 = xf[..., : h // 2], xf[..., h // 2 :]
    rot = jnp.concatenate([-x2, x1], axis=-1)
    return (xf * cos + rot * sin).astype(x.dtype)


def attention(
    q: jax.Array, k: jax.Array, v: jax.Array, mask: attn.AttentionMask | jax.Array | None, *,
    implementation: str | None = None,
) -> jax.Array:
    """Grouped-query attention through the project's attention entry point.

    Args:
      q: [B, L, N, H]; k, v: [B, S, K, H] with N a multiple of K.
      mask: an :class:`~animegamer_jax.models.attention.AttentionMask`, a bool [B, 1, L, S] /
        [B, L, S] "may attend" array, or None = full attention.
      implementation: ``attention.IMPLEMENTATIONS`` name; None = "auto".

    Returns: [B, L, N, H] in q's dtype. Scale is ``H**-0.5`` (Mistral).
    """
    if mask is not None and not isinstance(mask, attn.AttentionMask):
        mask = attn.AttentionMask(dense=mask[:, 0] if mask.ndim == 4 else mask)
    return attn.dot_product_attention(q, k, v, mask=mask, scale=q.shape[-1] ** -0.5,
                                      implementation=implementation)


def causal_window_mask(q_pos: jax.Array, k_pos: jax.Array, window: int | None) -> jax.Array:
    """bool [B, L, S]: ``k <= q`` and (window) ``q - k < window``. q_pos [B, L], k_pos [B, S]."""
    d = q_pos[:, :, None] - k_pos[:, None, :]
    m = d >= 0
    if window:
        m = m & (d < window)
    return m


class DecoderLayer(nnx.Module):
    """One Mistral block: x + Attn(RMSNorm(x)); x + MLP(RMSNorm(x)). Created stacked by :class:`Mistral`."""

    def __init__(self, cfg: MistralConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        d, n, kv, h, f = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.intermediate_size
        dt, pdt = _dtype(cfg.dtype), _dtype(cfg.param_dtype)

        def lin(name: str, ins, outs, in_axes, out_axes) -> LoRAEinsum:
            r = cfg.lora_rank if name in cfg.lora_targets else 0
            return LoRAEinsum(
                ins, outs, in_axes=in_axes, out_axes=out_axes, rank=r, alpha=cfg.lora_alpha,
                dropout=cfg.lora_dropout, dtype=dt, param_dtype=pdt, rngs=rngs,
            )

        self.input_layernorm = _rms_norm(d, cfg.rms_norm_eps, pdt)
        self.post_attention_layernorm = _rms_norm(d, cfg.rms_norm_eps, pdt)
        self.q_proj = lin("q_proj", (d,), (n, h), ("embed",), ("heads", "head_dim"))
        self.k_proj = lin("k_proj", (d,), (kv, h), ("embed",), ("kv_heads", "head_dim"))
        self.v_proj = lin("v_proj", (d,), (kv, h), ("embed",), ("kv_heads", "head_dim"))
        self.o_proj = lin("o_proj", (n, h), (d,), ("heads", "head_dim"), ("embed",))
        self.gate_proj = lin("gate_proj", (d,), (f,), ("embed",), ("mlp",))
        self.up_proj = lin("up_proj", (d,), (f,), ("embed",), ("mlp",))
        self.down_proj = lin("down_proj", (f,), (d,), ("mlp",), ("embed",))

    def __call__(
        self,
        x: jax.Array,
        positions: jax.Array,
        mask: attn.AttentionMask | None,
        cache_kv: tuple[jax.Array, jax.Array] | None,
        cache_index: jax.Array | None,
        dropout_rng: jax.Array | None,
        cache_layer: int | None = None,
    ) -> tuple[jax.Array, tuple[jax.Array, jax.Array] | None]:
        """x [B, L, D] -> ([B, L, D], updated (k, v) [B, S, K, H] or None). ``cache_index``: int32
        scalar (contiguous write at that index) or [B, L] slots (scattered write). With
        ``cache_layer`` = i, ``cache_kv`` is the whole stacked cache [num_layers, B, S, K, H]: the
        new keys/values are written into its layer i (in place when the buffer is donated) and the
        whole cache is returned (the unstacked decode path, :meth:`Mistral.__call__`)."""
        cfg = self.cfg
        keys = [None] * 7 if dropout_rng is None else list(jax.random.split(dropout_rng, 7))
        h = self.input_layernorm(x)
        q = self.q_proj(h, dropout_rng=keys[0])
        k = self.k_proj(h, dropout_rng=keys[1])
        v = self.v_proj(h, dropout_rng=keys[2])
        q = pmesh.constrain(rope(q, positions, cfg.rope_theta), ("act_batch", "act_length", "act_heads", None))
        k = rope(k, positions, cfg.rope_theta)
        new_kv = None
        if cache_kv is not None and cache_layer is not None:
            ck, cv = cache_kv
            if jnp.ndim(cache_index) == 2:
                rows = jnp.arange(ck.shape[1])[:, None]
                ck = ck.at[cache_layer, rows, cache_index].set(k.astype(ck.dtype))
                cv = cv.at[cache_layer, rows, cache_index].set(v.astype(cv.dtype))
            else:
                ck = jax.lax.dynamic_update_slice(ck, k.astype(ck.dtype)[None], (cache_layer, 0, cache_index, 0, 0))
                cv = jax.lax.dynamic_update_slice(cv, v.astype(cv.dtype)[None], (cache_layer, 0, cache_index, 0, 0))
            new_kv = (ck, cv)
            k, v = ck[cache_layer].astype(q.dtype), cv[cache_layer].astype(q.dtype)
        elif cache_kv is not None:
            ck, cv = cache_kv
            if jnp.ndim(cache_index) == 2:  # scattered slots [B, L]
                rows = jnp.arange(ck.shape[0])[:, None]
                ck = ck.at[rows, cache_index].set(k.astype(ck.dtype))
                cv = cv.at[rows, cache_index].set(v.astype(cv.dtype))
            else:
                ck = jax.lax.dynamic_update_slice(ck, k.astype(ck.dtype), (0, cache_index, 0, 0))
                cv = jax.lax.dynamic_update_slice(cv, v.astype(cv.dtype), (0, cache_index, 0, 0))
            new_kv = (ck, cv)
            k, v = ck.astype(q.dtype), cv.astype(q.dtype)
        o = attention(q, k, v, mask, implementation=cfg.attention_impl)
        x = x + self.o_proj(o, dropout_rng=keys[3])
        x = pmesh.constrain(x, ("act_batch", "act_length", "act_embed"))
        h = self.post_attention_layernorm(x)
        g = self.gate_proj(h, dropout_rng=keys[4])
        u = self.up_proj(h, dropout_rng=keys[5])
        m = pmesh.constrain(jax.nn.silu(g) * u, ("act_batch", "act_length", "act_mlp"))
        x = x + self.down_proj(m, dropout_rng=keys[6])
        return pmesh.constrain(x, ("act_batch", "act_length", "act_embed")), new_kv


class Mistral(nnx.Module):
    """Mistral causal LM (embed_tokens, stacked layers, norm, lm_head).

    Build with ``Mistral(MistralConfig(...), rngs=nnx.Rngs(0))`` or ``Mistral.from_config(cfg.mllm)``.
    Parameter tree (leading ``num_layers`` axis on ``layers.*``): ``embed_tokens [V, D]``,
    ``layers.{input,post_attention}_layernorm.weight [num_layers, D]``, ``layers.{q,k,v}_proj.kernel
    [num_layers, D, N|K, H]``, ``layers.o_proj.kernel [num_layers, N, H, D]``,
    ``layers.{gate,up}_proj.kernel [num_layers, D, F]``, ``layers.down_proj.kernel [num_layers, F, D]``,
    ``norm.weight [D]``, ``lm_head [D, V]``; LoRA adds ``lora_a [num_layers, *in, r]`` /
    ``lora_b [num_layers, r, *out]`` on the targeted projections.
    """

    def __init__(self, cfg: MistralConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        pdt = _dtype(cfg.param_dtype)
        v, d = cfg.vocab_size, cfg.hidden_size
        self.embed_tokens = nnx.Param(
            jax.random.normal(rngs.params(), (v, d), pdt) * 0.02, out_sharding=("vocab", "embed")
        )
        layer_keys = jax.random.split(rngs.params(), cfg.num_layers)

        @nnx.vmap(in_axes=0, out_axes=0, transform_metadata={nnx.PARTITION_NAME: "layers"})
        def make_layers(key: jax.Array) -> DecoderLayer:
            return DecoderLayer(cfg, rngs=nnx.Rngs(params=key))

        self.layers = make_layers(layer_keys)
        self.norm = _rms_norm(d, cfg.rms_norm_eps, pdt)
        self.lm_head = nnx.Param(
            jax.random.normal(rngs.params(), (d, v), pdt) * 0.02, out_sharding=("embed", "vocab")
        )

    @classmethod
    def from_config(cls, c: Any, *, rngs: nnx.Rngs, **overrides: Any) -> "Mistral":
        """Builds from a ``cfg.mllm`` ConfigDict."""
        return cls(MistralConfig.from_config(c, **overrides), rngs=rngs)

    def embed(self, input_ids: jax.Array) -> jax.Array:
        """input_ids [B, L] int -> embeddings [B, L, D] in cfg.dtype."""
        e = jnp.take(self.embed_tokens[...], input_ids, axis=0).astype(_dtype(self.cfg.dtype))
        return pmesh.constrain(e, ("act_batch", "act_length", "act_embed"))

    def logits(self, hidden: jax.Array) -> jax.Array:
        """hidden [B, L, D] (post-norm) -> logits [B, L, V] float32."""
        dt = _dtype(self.cfg.dtype)
        out = jnp.einsum("bld,dv->blv", hidden.astype(dt), self.lm_head[...].astype(dt))
        return pmesh.constrain(out.astype(jnp.float32), ("act_batch", "act_length", "act_vocab"))

    def __call__(
        self,
        input_ids: jax.Array | None = None,
        *,
        inputs_embeds: jax.Array | None = None,
        positions: jax.Array | None = None,
        attention_mask: jax.Array | None = None,
        padding_mask: jax.Array | None = None,
        cache: KVCache | None = None,
        return_logits: bool = True,
        dropout_rng: jax.Array | None = None,
        cache_slots: jax.Array | None = None,
        layer_states: tuple[Any, ...] | None = None,
        empty_cache: bool = False,
    ) -> MistralOutput:
        """Runs the decoder.

        Args:
          input_ids: int [B, L]; or ``inputs_embeds`` float [B, L, D] (exactly one of the two).
          positions: int [B, L] RoPE positions; default ``cache.length + arange(L)`` (0.. without cache).
          attention_mask: an :class:`~animegamer_jax.models.attention.AttentionMask` (the MLLM's
            hybrid mask; unset positions default to the cache positions) or a bool [B, L, S] /
            [B, 1, L, S] "may attend" array; either REPLACES the causal + sliding-window mask
            (S = L without cache, S = S_max with cache). None = causal (+ window) over the valid keys.
          padding_mask: bool [B, S] valid keys (ANDed with the mask); None = all valid.
          cache: :class:`KVCache`; the new keys/values are written at ``cache.length`` and the
            returned cache has ``length + L``. Keys past the new length are masked.
          return_logits: False skips the lm_head (pass B of the MLLM needs hidden states only).
          dropout_rng: PRNG key enabling LoRA dropout; None = deterministic.
          cache_slots: int [B, L] cache slots the new keys/values go to (with ``cache``): then
            ``positions`` and an AttentionMask with ``q_pos``, ``k_pos`` and ``kv_valid`` of every
            slot are required, no length-based validity is added and ``cache.length`` is kept.
          layer_states: None (scan the stacked ``layers``), or one state per layer
            (:func:`unstacked_layers`), applied in a loop instead (the ``decode_layers="unstacked"`` path
            of :func:`prefill` / :func:`decode_step`; same function, no weight slicing in the program).
          empty_cache: static promise that ``cache`` holds nothing yet (``cache.length == 0``, a
            prompt prefill): positions start at 0 statically, so a causal prompt runs the
            attention's causal query blocks (models/attention.py ``_causal_blocks``).

        Returns:
          :class:`MistralOutput` (logits [B, L, V] float32, hidden [B, L, D], cache).

        Raises:
          ValueError: both or neither of input_ids / inputs_embeds; a prompt longer than the cache;
            ``cache_slots`` without a cache, positions or a full AttentionMask.
        """
        cfg = self.cfg
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("Mistral: pass exactly one of input_ids / inputs_embeds")
        x = self.embed(input_ids) if inputs_embeds is None else inputs_embeds.astype(_dtype(cfg.dtype))
        x = pmesh.constrain(x, ("act_batch", "act_length", "act_embed"))
        b, l = x.shape[:2]
        if cache_slots is not None:
            am = attention_mask
            if (cache is None or positions is None or not isinstance(am, attn.AttentionMask)
                    or am.q_pos is None or am.k_pos is None or am.kv_valid is None):
                raise ValueError("Mistral: cache_slots needs a cache, positions and an AttentionMask with "
                                 "q_pos, k_pos and kv_valid")
        start = jnp.zeros((), jnp.int32) if cache is None or empty_cache else cache.length
        if positions is None:
            positions = jnp.broadcast_to(start + jnp.arange(l, dtype=jnp.int32), (b, l))
        if cache is None:
            s = l
            k_pos = jnp.broadcast_to(jnp.arange(s, dtype=jnp.int32), (b, s))
            valid = None
        else:
            s = cache.k.shape[2]
            if l > s:
                raise ValueError(f"Mistral: {l} tokens do not fit a KV cache of {s} positions")
            k_pos = jnp.broadcast_to(jnp.arange(s, dtype=jnp.int32), (b, s))
            valid = None if cache_slots is not None else k_pos < start + l
        q_pos = jnp.broadcast_to(start + jnp.arange(l, dtype=jnp.int32), (b, l))
        if attention_mask is None:
            mask = attn.causal_mask(cfg.window)
        elif isinstance(attention_mask, attn.AttentionMask):
            mask = attention_mask
        else:
            dense = attention_mask if attention_mask.ndim == 3 else attention_mask[:, 0]
            mask = attn.AttentionMask(dense=jnp.broadcast_to(dense.astype(bool), (b, l, s)))
        kv_valid = mask.kv_valid
        for extra in (valid, None if padding_mask is None else padding_mask.astype(bool)):
            if extra is not None:
                kv_valid = extra if kv_valid is None else kv_valid & extra
        if cache is None or (empty_cache and cache_slots is None):
            # positions 0..L-1 (0..S-1 for keys): the mask's defaults (lets "dense" split causal blocks)
            q_pos = k_pos = None
        mask = mask.replace(q_pos=q_pos if mask.q_pos is None else mask.q_pos,
                            k_pos=k_pos if mask.k_pos is None else mask.k_pos, kv_valid=kv_valid)

        graphdef, layer_state = nnx.split(self.layers)
        layer_keys = None if dropout_rng is None else jax.random.split(dropout_rng, cfg.num_layers)

        def body(carry: jax.Array, xs: Any) -> tuple[jax.Array, Any]:
            st, kv, key = xs
            layer = nnx.merge(graphdef, st)
            y, new_kv = layer(carry, positions, mask, kv, start if cache_slots is None else cache_slots, key)
            return y, new_kv

        body = remat_lib.remat(body, cfg.remat)
        kv_in = None if cache is None else (cache.k, cache.v)
        if layer_states is None:
            x, kv_out = jax.lax.scan(body, x, (layer_state, kv_in, layer_keys))
        else:
            if len(layer_states) != cfg.num_layers:
                raise ValueError(f"Mistral: {len(layer_states)} layer states for {cfg.num_layers} layers")
            kv_out = kv_in  # the whole stacked cache, each layer writing its slice in place
            index = start if cache_slots is None else cache_slots
            for i, st in enumerate(layer_states):
                layer = nnx.merge(graphdef, st)
                x, kv_out = layer(x, positions, mask, kv_out, index, None if layer_keys is None else layer_keys[i],
                                  cache_layer=None if kv_out is None else i)
        hidden = self.norm(x)
        new_len = start + l if cache_slots is None else start
        new_cache = None if cache is None else KVCache(kv_out[0], kv_out[1], new_len)
        return MistralOutput(self.logits(hidden) if return_logits else None, hidden, new_cache)


#: parameter names (path parts) of the paper's trainable set besides the LoRA factors (docs/mllm.md#lora):
#: every RMSNorm weight, ``embed_tokens``, ``lm_head`` and the MLLM's resamplers
#: (``train.model.trainable_filter("b")`` builds the NNX filter)
TRAINABLE_NAMES: frozenset[str] = frozenset({
    "input_layernorm", "post_attention_layernorm", "norm", "embed_tokens", "lm_head", "input_resampler",
    "output_resampler"})


# ---------------------------------------------------------------------------------------------
# Jitted prefill / decode. The model is passed as (graphdef, state) so one compiled executable
# serves every step: shapes are fixed by the cache size, hence no per-token recompilation.


def unstacked_layers(model: Mistral) -> tuple[Any, ...] | None:
    """Per-layer copies of ``model.layers``' state (``num_layers`` states, leaves without the
    leading layer axis) for the ``decode_layers="unstacked"`` path, or None where that path is off
    (``"scan"``, or ``"auto"`` when the weights are not on CPU devices). Split once per model and reused
    while the stacked parameters are the same arrays (a weight update or LoRA merge makes new ones: split
    again).
    Costs one more copy of the layer weights in host memory.

    Raises: ValueError for an unknown ``decode_layers``.
    """
    mode = model.cfg.decode_layers
    if mode not in ("auto", "scan", "unstacked"):
        raise ValueError(f"mllm.decode_layers={mode!r}; use 'auto', 'scan' or 'unstacked'")
    state = nnx.state(model.layers)
    leaves = jax.tree.leaves(state)
    # "auto": unstacked only where the weights live on CPU devices (the target, not the host's backend)
    if mode == "scan" or (mode == "auto" and target.of_arrays(leaves).platform != "cpu"):
        return None
    hit = _UNSTACKED.get(model)
    if hit is not None and len(hit[0]) == len(leaves) and all(a is b for a, b in zip(hit[0], leaves)):
        return hit[1]
    per = tuple(jax.tree.map(lambda a, i=i: a[i], state) for i in range(model.cfg.num_layers))
    _UNSTACKED[model] = (leaves, per)  # the stacked arrays themselves, compared by identity
    return per


#: model -> (its stacked layer arrays, their per-layer split)
_UNSTACKED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


@functools.partial(jax.jit, static_argnums=(0, 6), donate_argnums=(4,))
def _prefill(graphdef: Any, state: Any, input_ids: Any, inputs_embeds: Any, cache: KVCache, layer_states=None,
             empty_cache: bool = False):
    model = nnx.merge(graphdef, state)
    out = model(input_ids, inputs_embeds=inputs_embeds, cache=cache, layer_states=layer_states,
                empty_cache=empty_cache)
    return out.logits[:, -1], out.cache


@functools.partial(jax.jit, static_argnums=(0,), donate_argnums=(3,))
def _decode_step(graphdef: Any, state: Any, token: jax.Array, cache: KVCache, allowed: jax.Array,
                 layer_states=None):
    model = nnx.merge(graphdef, state)
    out = model(token[:, None], cache=cache, layer_states=layer_states)
    logits = out.logits[:, -1]
    nxt = jnp.argmax(jnp.where(allowed, logits, -jnp.inf), axis=-1).astype(jnp.int32)
    return nxt, logits, out.cache


def prefill(
    model: Mistral,
    cache: KVCache,
    input_ids: jax.Array | None = None,
    inputs_embeds: jax.Array | None = None,
    *,
    empty_cache: bool = False,
) -> tuple[jax.Array, KVCache]:
    """Jitted prompt pass. ids [B, L] or embeds [B, L, D] -> (last logits [B, V] fp32, cache).

    ``cache`` is donated (do not reuse it). Compiles once per prompt length. Layers as
    ``cfg.decode_layers`` says (:func:`unstacked_layers`). ``empty_cache``: the cache is fresh
    (``KVCache.init``; see :meth:`Mistral.__call__`).
    """
    graphdef, state = nnx.split(model)
    return _prefill(graphdef, state, input_ids, inputs_embeds, cache, unstacked_layers(model), empty_cache)


def decode_step(
    model: Mistral, token: jax.Array, cache: KVCache, allowed: jax.Array | None = None
) -> tuple[jax.Array, jax.Array, KVCache]:
    """One jitted greedy step. token int [B] -> (next token int32 [B], logits [B, V] fp32, cache).

    ``allowed``: bool [B, V] tokens the argmax may pick (constrained decoding); None = all.
    The cache is donated. Compiles once per (cache shape, batch) pair.
    """
    graphdef, state = nnx.split(model)
    if allowed is None:
        allowed = jnp.ones((token.shape[0], model.cfg.vocab_size), bool)
    return _decode_step(graphdef, state, token.astype(jnp.int32), cache, allowed, unstacked_layers(model))


def greedy_generate(
    model: Mistral,
    max_new_tokens: int,
    *,
    input_ids: jax.Array | None = None,
    inputs_embeds: jax.Array | None = None,
    cache_len: int | None = None,
    allowed_fn: Callable[[int, jax.Array], jax.Array] | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Greedy decoding with the KV cache (HF ``generate(do_sample=False)``).

    Args:
      max_new_tokens: tokens to generate.
      input_ids [B, L] or inputs_embeds [B, L, D]: the prompt.
      cache_len: cache size S_max (default L + max_new_tokens rounded up to a multiple of 64, so turns of
        similar length share one compiled decode step).
      allowed_fn: ``(step, previous_tokens [B]) -> bool [B, V]`` legal-token mask per step
        (constrained decoding); None = unconstrained.

    Returns:
      (tokens int32 [B, max_new_tokens], logits fp32 [B, max_new_tokens, V]) where logits[:, i]
      produced tokens[:, i].
    """
    x = input_ids if input_ids is not None else inputs_embeds
    b, l = x.shape[:2]
    s = cache_len or -(-(l + max_new_tokens) // 64) * 64
    dt = model.cfg.dtype
    cache = KVCache.init(model.cfg, b, s, dt)
    graphdef, state = nnx.split(model)  # once: splitting every step costs host time
    layers = unstacked_layers(model)
    logits, cache = _prefill(graphdef, state, input_ids, inputs_embeds, cache, layers, True)  # fresh cache
    toks, outs = [], []
    every = jnp.ones((b, model.cfg.vocab_size), bool)
    allowed = allowed_fn(0, None) if allowed_fn else every
    tok = jnp.argmax(jnp.where(allowed, logits, -jnp.inf), axis=-1).astype(jnp.int32)
    toks.append(tok)
    outs.append(logits)
    for t in range(1, max_new_tokens):
        allowed = allowed_fn(t, tok) if allowed_fn else every
        tok, logits, cache = _decode_step(graphdef, state, tok, cache, allowed, layers)
        toks.append(tok)
        outs.append(logits)
    return jnp.stack(toks, axis=1), jnp.stack(outs, axis=1)
