"""The layers every model family shares: one LayerNorm, one RMSNorm, the einsum projection with its LoRA,
and `stacked` (a module built n times, its parameters on a leading `layers` axis).

:class:`LoRAEinsum` maps ``x[..., *in_features] -> y[..., *out_features]`` with a kernel
``[*in_features, *out_features]`` (multi-head projections keep their head axes) plus, when ``rank > 0``,
the LoRA update of Hu et al. 2021 as ``peft`` implements it (docs/mllm.md#lora):
``y = x . W + (alpha / rank) * (dropout(x) . A) . B``, with ``A [*in, r]`` (kaiming-uniform) and
``B [r, *out]`` (zero: a fresh adapter is an exact no-op). The factors are :class:`LoRAFactors`, the one
LoRA factor class, which the DiT's reference adapter and character LoRAs store too.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

Axes = Sequence[str | None]


def stacked(n: int, make: Callable[[nnx.Rngs], nnx.Module], rngs: nnx.Rngs) -> nnx.Module:
    """``n`` modules ``make(rngs_i)`` (``rngs`` split ``n`` ways) as one module whose every parameter has a
    leading axis of size ``n``, logical name ``layers``: the layer stacks a scan runs."""

    @nnx.split_rngs(splits=n)
    @nnx.vmap(in_axes=(0,), out_axes=0, transform_metadata={nnx.PARTITION_NAME: "layers"})
    def create(r: nnx.Rngs) -> nnx.Module:
        return make(r)

    return create(rngs)


def _draw(rngs: nnx.Rngs | None, n: int) -> None:
    """Draws ``n`` keys of the ``params`` stream of ``rngs`` (none when None): a norm built with ``rngs``
    takes one per parameter, as CLIP's and T5's did, so the random weights built after it keep their
    values (the norms' own weights are ones and zeros)."""
    for _ in range(n if rngs is not None else 0):
        rngs.params()


def layer_norm(x: jax.Array, scale: jax.Array | None, bias: jax.Array | None, eps: float) -> jax.Array:
    """LayerNorm over the last axis with statistics in float32, returned in x's dtype; ``scale`` / ``bias``
    [D] applied in float32 when given (None: no affine, the DiT's adaLN norms)."""
    xf = x.astype(jnp.float32)
    mean = xf.mean(-1, keepdims=True)
    var = jnp.square(xf - mean).mean(-1, keepdims=True)
    y = (xf - mean) * jax.lax.rsqrt(var + eps)
    if scale is not None:
        y = y * scale.astype(jnp.float32) + bias.astype(jnp.float32)
    return y.astype(x.dtype)


class LayerNorm(nnx.Module):
    """The one LayerNorm: :func:`layer_norm` with ``scale`` (ones) and ``bias`` (zeros) [D], logical axis
    ``norm``, stored in ``param_dtype``. x [..., D] -> [..., D] in x's dtype. ``rngs``: see :func:`_draw`."""

    def __init__(self, dim: int, eps: float, *, param_dtype: Any = jnp.float32, rngs: nnx.Rngs | None = None):
        self.eps = float(eps)
        _draw(rngs, 2)
        self.scale = nnx.Param(jnp.ones((dim,), param_dtype), out_sharding=("norm",))
        self.bias = nnx.Param(jnp.zeros((dim,), param_dtype), out_sharding=("norm",))

    def __call__(self, x: jax.Array) -> jax.Array:
        return layer_norm(x, self.scale[...], self.bias[...], self.eps)


class RMSNorm(nnx.Module):
    """The one RMSNorm: ``w * x / sqrt(mean(x^2) + eps)`` over the last axis, statistics in float32, no
    mean, no bias. x [..., D] -> [..., D] in x's dtype.

    Args:
      dim, eps: the width D and epsilon.
      param_name: the weight's name, ``scale`` (T5) or ``weight`` (Mistral: HF's name, kept in checkpoints).
      cast_first: cast the normalized x to x's dtype before the weight multiply (HF MistralRMSNorm);
        False multiplies in float32 and casts after (T5).
      param_dtype: the weight's storage dtype; rngs: see :func:`_draw`.
    """

    def __init__(self, dim: int, eps: float, *, param_name: str = "scale", cast_first: bool = False,
                 param_dtype: Any = jnp.float32, rngs: nnx.Rngs | None = None):
        self.eps = float(eps)
        _draw(rngs, 1)
        self.param_name = param_name
        self.cast_first = bool(cast_first)
        setattr(self, param_name, nnx.Param(jnp.ones((dim,), param_dtype), out_sharding=("norm",)))

    def __call__(self, x: jax.Array) -> jax.Array:
        dt = x.dtype
        w = getattr(self, self.param_name)[...]
        xf = x.astype(jnp.float32)
        xf = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + self.eps)
        if self.cast_first:
            return w.astype(dt) * xf.astype(dt)
        return (xf * w.astype(jnp.float32)).astype(dt)


class LoRAParam(nnx.Param):
    """A LoRA factor (``lora_a`` / ``lora_b``); a Param subclass so optimizers and filters can select it."""


def _uniform_fan_in(key: jax.Array, shape: Sequence[int], dtype: Any, fan_in: int) -> jax.Array:
    # peft / torch nn.Linear default: kaiming_uniform(a=sqrt(5)) == U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
    bound = 1.0 / math.sqrt(fan_in)
    return jax.random.uniform(key, tuple(shape), dtype, -bound, bound)


def low_rank_update(x: jax.Array, lora_a: jax.Array, lora_b: jax.Array, scaling: float, n_in: int,
                    dtype: Any) -> jax.Array:
    """The LoRA branch ``scaling * (x . A) . B`` in ``dtype``: ``x [..., *in]``, ``A [*in, r]``,
    ``B [r, *out]`` -> ``[..., *out]``; ``n_in`` = number of contracted input dims."""
    low = jnp.tensordot(x.astype(dtype), lora_a.astype(dtype), axes=n_in)
    return scaling * jnp.tensordot(low, lora_b.astype(dtype), axes=1)


def lora_delta(lora_a: jax.Array, lora_b: jax.Array, scaling: float, n_in: int) -> jax.Array:
    """``scaling * A . B`` in fp32, the weight update a LoRA adds: ``A (*lead, *in, r)``, ``B (*lead, r,
    *out)`` -> ``(*lead, *in, *out)`` (leading stacked axes, e.g. "layers", kept); ``n_in`` = number of
    input dims."""
    a = lora_a.astype(jnp.float32)
    b = lora_b.astype(jnp.float32)
    rank = a.shape[-1]
    lead = a.shape[: a.ndim - n_in - 1]
    ins, outs = a.shape[len(lead):-1], b.shape[len(lead) + 1:]
    a2 = a.reshape(lead + (math.prod(ins), rank))
    b2 = b.reshape(lead + (rank, math.prod(outs)))
    return (jnp.matmul(a2, b2) * scaling).reshape(lead + ins + outs)


class LoRAFactors(nnx.Module):
    """The one LoRA factor class: ``lora_a [*in, r]`` (kaiming-uniform ``U(+-1/sqrt(fan_in))``) and
    ``lora_b [r, *out]`` (zeros), :class:`LoRAParam`, LoRA rank axis named ``"lora"``; ``rank`` 0 holds
    none (both None). The update is ``(alpha / rank) * (x . A) . B`` (:meth:`update`), its weight
    :meth:`delta`. :class:`LoRAEinsum` holds its adapter as these factors; the DiT's reference adapter
    and character LoRAs hold one per attention projection.

    Args:
      in_features / out_features, in_axes / out_axes: the projection's dims and their logical names.
      rank, alpha: LoRA rank and alpha (peft scaling ``alpha / rank``, not rsLoRA).
      param_dtype: storage dtype.
      rngs: an ``nnx.Rngs`` (its ``params`` stream drawn once) or the PRNG key of ``lora_a``.
    """

    def __init__(self, in_features: Sequence[int], out_features: Sequence[int], *, in_axes: Axes, out_axes: Axes,
                 rank: int, alpha: float, param_dtype: Any = jnp.float32, rngs: nnx.Rngs | jax.Array):
        self._init_factors(tuple(int(d) for d in in_features), tuple(int(d) for d in out_features), in_axes,
                           out_axes, rank, alpha, param_dtype, rngs)

    def _init_factors(self, ins: tuple[int, ...], outs: tuple[int, ...], in_axes: Axes, out_axes: Axes, rank: int,
                      alpha: float, param_dtype: Any, rngs: nnx.Rngs | jax.Array) -> None:
        self.rank = int(rank)
        self.alpha = float(alpha)
        self.n_in = len(ins)
        if self.rank > 0:
            key = rngs.params() if isinstance(rngs, nnx.Rngs) else rngs
            self.lora_a = LoRAParam(_uniform_fan_in(key, ins + (self.rank,), param_dtype, math.prod(ins)),
                                    out_sharding=tuple(in_axes) + ("lora",))
            self.lora_b = LoRAParam(jnp.zeros((self.rank,) + outs, param_dtype),
                                    out_sharding=("lora",) + tuple(out_axes))
        else:
            self.lora_a = None
            self.lora_b = None

    @property
    def scaling(self) -> float:
        """``alpha / rank`` (peft's default scaling); 0 without factors."""
        return self.alpha / self.rank if self.rank else 0.0

    def update(self, x: jax.Array, dtype: Any) -> jax.Array:
        """The LoRA branch ``x [..., *in] -> [..., *out]`` in ``dtype`` (:func:`low_rank_update`)."""
        return low_rank_update(x, self.lora_a[...], self.lora_b[...], self.scaling, self.n_in, dtype)

    def delta(self) -> jax.Array:
        """``scaling * A . B`` with the kernel's shape (leading stacked axes kept), in fp32 (:func:`lora_delta`)."""
        return lora_delta(self.lora_a[...], self.lora_b[...], self.scaling, self.n_in)


class LoRAEinsum(LoRAFactors):
    """Linear map over several input / output axes with optional LoRA and bias.

    Args:
      in_features: contracted trailing input dims, e.g. ``(4096,)``.
      out_features: output dims, e.g. ``(32, 128)`` for ``heads x head_dim``.
      in_axes / out_axes: logical axis names for those dims (parallel/mesh.py names).
      rank: LoRA rank r; 0 disables the adapter (no LoRA params exist).
      alpha: LoRA alpha; the update is scaled by ``alpha / rank`` (peft, not rsLoRA).
      dropout: dropout rate on the LoRA branch input (peft ``lora_dropout``), active only when a
        ``dropout_rng`` is passed to ``__call__``.
      use_bias: adds a bias of shape ``out_features`` (axes ``out_axes``).
      kernel_init: ``(key, shape, dtype) -> array`` for the base kernel; default peft's
        kaiming-uniform ``U(+-1/sqrt(fan_in))`` (the DiT passes its SAT-style normal init).
      dtype: computation dtype (inputs and params are cast to it); param_dtype: storage dtype.
      rngs: ``nnx.Rngs`` with a ``params`` stream.

    Parameters: ``kernel (*in, *out)``, optional ``bias (*out)``, and its :class:`LoRAFactors`
    ``lora_a (*in, r)``, ``lora_b (r, *out)``.
    """

    def __init__(
        self,
        in_features: Sequence[int],
        out_features: Sequence[int],
        *,
        in_axes: Axes,
        out_axes: Axes,
        rank: int = 0,
        alpha: float = 1.0,
        dropout: float = 0.0,
        use_bias: bool = False,
        dtype: Any = jnp.float32,
        param_dtype: Any = jnp.float32,
        kernel_init: Any = None,
        rngs: nnx.Rngs,
    ):
        self.in_features = tuple(int(d) for d in in_features)
        self.out_features = tuple(int(d) for d in out_features)
        if len(in_axes) != len(self.in_features) or len(out_axes) != len(self.out_features):
            raise ValueError(
                f"LoRAEinsum: axes {tuple(in_axes)}/{tuple(out_axes)} do not match features "
                f"{self.in_features}/{self.out_features}"
            )
        self.dropout = float(dropout)
        self.dtype = dtype
        fan_in = math.prod(self.in_features)
        kshape = self.in_features + self.out_features
        self.kernel = nnx.Param(
            _uniform_fan_in(rngs.params(), kshape, param_dtype, fan_in) if kernel_init is None
            else kernel_init(rngs.params(), kshape, param_dtype),
            out_sharding=tuple(in_axes) + tuple(out_axes),
        )
        self.bias = (
            nnx.Param(jnp.zeros(self.out_features, param_dtype), out_sharding=tuple(out_axes)) if use_bias else None
        )
        self._init_factors(self.in_features, self.out_features, in_axes, out_axes, rank, alpha, param_dtype, rngs)
        self.kernel_scale = None  # set by quantize_int8

    def __call__(self, x: jax.Array, *, dropout_rng: jax.Array | None = None) -> jax.Array:
        """``x [..., *in] -> y [..., *out]`` in ``self.dtype``.

        Args:
          x: input whose trailing dims equal ``in_features``.
          dropout_rng: PRNG key enabling LoRA dropout (training); None = deterministic.
        """
        n_in = len(self.in_features)
        if tuple(x.shape[x.ndim - n_in :]) != self.in_features:
            raise ValueError(f"LoRAEinsum: input shape {x.shape} does not end with {self.in_features}")
        x = x.astype(self.dtype)
        if self.kernel_scale is not None:  # weight-only int8: int8 x activation dot, fp32 accumulation
            y = jax.lax.dot_general(x, self.kernel[...], ((tuple(range(x.ndim - n_in, x.ndim)), tuple(range(n_in))),
                                                          ((), ())), preferred_element_type=jnp.float32)
            y = (y * self.kernel_scale[...].astype(jnp.float32)).astype(self.dtype)
        else:
            y = jnp.tensordot(x, self.kernel[...].astype(self.dtype), axes=n_in)
        if self.bias is not None:  # bias before the LoRA branch: `W x + b + s B A x` (SAT lora2 order)
            y = y + self.bias[...].astype(self.dtype)
        if self.lora_a is not None:
            h = x
            if dropout_rng is not None and self.dropout > 0.0:
                keep = jax.random.bernoulli(dropout_rng, 1.0 - self.dropout, h.shape)
                h = jnp.where(keep, h / (1.0 - self.dropout), 0.0).astype(self.dtype)
            y = y + self.update(h, self.dtype)
        return y

    def merge(self) -> None:
        """Folds the adapter into ``kernel`` (in place) and removes the LoRA params (rank -> 0)."""
        if self.lora_a is None:
            return
        k = self.kernel[...]
        self.kernel[...] = (k.astype(jnp.float32) + self.delta()).astype(k.dtype)
        self.lora_a = None
        self.lora_b = None
        self.rank = 0

    def quantize_int8(self) -> None:
        """Weight-only int8, in place: ``kernel`` becomes int8 ``round(W / s)`` with ``kernel_scale`` s =
        max|W| / 127 per output channel (shape ``(*lead, *out_features)``, float32; over the input axes), so
        the layer computes ``(x . W_q) * s`` with an int8 x ``dtype`` dot accumulated in fp32. An adapter is
        merged first (:meth:`merge`). No-op when already quantized."""
        if self.kernel_scale is not None:
            return
        self.merge()
        w = self.kernel[...].astype(jnp.float32)
        n_in, n_out = len(self.in_features), len(self.out_features)
        lead = w.ndim - n_in - n_out
        amax = jnp.max(jnp.abs(w), axis=tuple(range(lead, lead + n_in)))
        scale = jnp.where(amax > 0, amax / 127.0, 1.0)
        q = jnp.round(w / jnp.expand_dims(scale, tuple(range(lead, lead + n_in)))).astype(jnp.int8)
        names = self.kernel.get_metadata().get("out_sharding") or (None,) * w.ndim
        self.kernel = nnx.Param(q, out_sharding=tuple(names))
        self.kernel_scale = nnx.data(nnx.Param(scale, out_sharding=tuple(names[:lead]) + tuple(names[lead + n_in:])))


def quantize_int8(module: nnx.Module) -> nnx.Module:
    """:meth:`LoRAEinsum.quantize_int8` on every :class:`LoRAEinsum` inside ``module``, in place; returns it."""
    for _, m in nnx.iter_modules(module):
        if isinstance(m, LoRAEinsum):
            m.quantize_int8()
    return module


def merge_lora(module: nnx.Module) -> nnx.Module:
    """Merges every :class:`LoRAEinsum` adapter inside ``module`` into its kernel, in place.

    After merging the module has no :class:`LoRAParam` left and computes ``x . (W + s A B)``
    (``W = W_base + (alpha/r) B A`` in peft's orientation, docs/mllm.md#checkpoint-keys). Returns ``module``.
    """
    for _, m in nnx.iter_modules(module):
        if isinstance(m, LoRAEinsum):
            m.merge()
    return module


def lora_filter(path: tuple[Any, ...], value: Any) -> bool:
    """nnx filter selecting LoRA factors (``LoRAParam`` variables)."""
    return isinstance(value, LoRAParam)
