"""Generic LoRA: a linear / einsum parameter set with optional low-rank adapters.

A :class:`LoRAEinsum` maps ``x[..., *in_features] -> y[..., *out_features]`` with a kernel of shape
``[*in_features, *out_features]`` (so multi-head projections keep their head axes, gemma style) and,
when ``rank > 0``, adds the LoRA update of Hu et al. 2021 as implemented by ``peft`` (the reference
of AnimeGamer's MLLM, docs/mllm.md#lora)::

    y = x . W  +  (alpha / rank) * (dropout(x) . A) . B

with ``A: [*in_features, rank]`` (peft ``lora_A.weight`` transposed, kaiming-uniform init) and
``B: [rank, *out_features]`` (peft ``lora_B.weight`` transposed, zero init), so a fresh adapter is
an exact no-op. :func:`merge_lora` folds ``scaling * A . B`` into ``W`` for inference.

Nothing here knows a model: Mistral's projections and the DiT's (attention q/k/v/out with LoRA,
adaLN and MLP without) are all this module. Modules created under ``nnx.vmap`` (stacked
layers) carry leading axes on every parameter; :func:`merge_lora` handles them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

Axes = Sequence[str | None]


class LoRAParam(nnx.Param):
    """A LoRA factor (``lora_a`` / ``lora_b``); a Param subclass so optimizers and filters can select it."""


def _uniform_fan_in(key: jax.Array, shape: Sequence[int], dtype: Any, fan_in: int) -> jax.Array:
    # peft / torch nn.Linear default: kaiming_uniform(a=sqrt(5)) == U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
    bound = 1.0 / math.sqrt(fan_in)
    return jax.random.uniform(key, tuple(shape), dtype, -bound, bound)


def low_rank_update(x: jax.Array, lora_a: jax.Array, lora_b: jax.Array, scaling: float, n_in: int,
                    dtype: Any) -> jax.Array:
    """The LoRA branch ``scaling * (x . A) . B`` in ``dtype``: ``x [..., *in]``, ``A [*in, r]``,
    ``B [r, *out]`` -> ``[..., *out]``; ``n_in`` = number of contracted input dims. The one LoRA
    formula: :class:`LoRAEinsum` adds it to its base map, the DiT's reference adapter
    (models/cogvideox/reference.py) adds it to the DiT's attention projections."""
    low = jnp.tensordot(x.astype(dtype), lora_a.astype(dtype), axes=n_in)
    return scaling * jnp.tensordot(low, lora_b.astype(dtype), axes=1)


def lora_delta(lora_a: jax.Array, lora_b: jax.Array, scaling: float, n_in: int) -> jax.Array:
    """``scaling * A . B`` in fp32, the weight update a LoRA adds: ``A (*lead, *in, r)``, ``B (*lead, r,
    *out)`` -> ``(*lead, *in, *out)`` (leading stacked axes, e.g. "layers", kept); ``n_in`` = number of
    input dims. :meth:`LoRAEinsum.delta` and the DiT's character LoRAs (models/cogvideox/character.py)
    merge with it."""
    a = lora_a.astype(jnp.float32)
    b = lora_b.astype(jnp.float32)
    rank = a.shape[-1]
    lead = a.shape[: a.ndim - n_in - 1]
    ins, outs = a.shape[len(lead):-1], b.shape[len(lead) + 1:]
    a2 = a.reshape(lead + (math.prod(ins), rank))
    b2 = b.reshape(lead + (rank, math.prod(outs)))
    return (jnp.matmul(a2, b2) * scaling).reshape(lead + ins + outs)


class LoRAEinsum(nnx.Module):
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

    Parameters: ``kernel (*in, *out)``, optional ``bias (*out)``, ``lora_a (*in, r)`` and
    ``lora_b (r, *out)`` (:class:`LoRAParam`, LoRA rank axis named ``"lora"``).
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
        self.rank = int(rank)
        self.alpha = float(alpha)
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
        if self.rank > 0:
            self.lora_a = LoRAParam(
                _uniform_fan_in(rngs.params(), self.in_features + (self.rank,), param_dtype, fan_in),
                out_sharding=tuple(in_axes) + ("lora",),
            )
            self.lora_b = LoRAParam(
                jnp.zeros((self.rank,) + self.out_features, param_dtype), out_sharding=("lora",) + tuple(out_axes)
            )
        else:
            self.lora_a = None
            self.lora_b = None
        self.kernel_scale = None  # set by quantize_int8

    @property
    def scaling(self) -> float:
        """``alpha / rank`` (peft's default scaling)."""
        return self.alpha / self.rank if self.rank else 0.0

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
            y = y + low_rank_update(h, self.lora_a[...], self.lora_b[...], self.scaling, n_in, self.dtype)
        return y

    def delta(self) -> jax.Array:
        """``scaling * A . B`` with the kernel's shape (leading stacked axes kept), in fp32 (:func:`lora_delta`)."""
        return lora_delta(self.lora_a[...], self.lora_b[...], self.scaling, len(self.in_features))

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
