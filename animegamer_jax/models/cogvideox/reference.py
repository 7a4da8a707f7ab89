"""The DiT's reference adapter: play a character from one reference image (training phase r).

A reference image, VAE-encoded as ONE latent frame ``[B, 1, C, h, w]`` (scaled like the clip's
latents, :func:`encode_reference`), joins the DiT's sequence as extra video tokens (Concat-ID-style
concatenation, docs/dit.md#reference-conditioning): it is patchified with the DiT's own patch
embedding, gets the frame-0 spatial sin-cos position of the video tokens plus this adapter's learned
``type_embed`` [D], and is appended after the video tokens; the DiT drops those tokens before its
output layer. While a reference is given, this adapter's own LoRA set (``lora`` per layer: q, k, v
and the output projection, the one LoRA formula ``models.lora.low_rank_update``) is added to the
DiT's attention projections for every token. Without a reference the DiT never touches the adapter,
so its output is exactly that of a DiT without one.

Parameters (docs/design.md#dimension-letters: ``D`` width, ``N`` heads, ``H`` head dim, ``r`` =
``reference_lora_rank``): ``type_embed`` [D]; ``lora.{q,k,v}_a`` [num_layers, D, r], ``lora.{q,k,v}_b``
[num_layers, r, N, H], ``lora.out_a`` [num_layers, N, H, r], ``lora.out_b`` [num_layers, r, D]
(``LoRAParam``; the B factors start at zero, so a fresh adapter changes the attention weights by
nothing and the reference acts through attention alone).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from animegamer_jax.models.lora import LoRAParam, low_rank_update

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class ReferenceConfig:
    """Sizes of the adapter: the DiT's width / heads / layers and the adapter's LoRA rank and alpha."""

    hidden_size: int
    num_layers: int
    num_heads: int
    head_dim: int
    lora_rank: int = 64
    lora_alpha: float = 64.0
    param_dtype: str = "float32"

    @property
    def scaling(self) -> float:
        return self.lora_alpha / self.lora_rank

    @classmethod
    def from_config(cls, dit: Any) -> "ReferenceConfig":
        """From the ``cfg.dit`` section (``reference_lora_rank`` / ``reference_lora_alpha``, default 64 / 64)."""
        get = lambda k, d: dit.get(k, d) if hasattr(dit, "get") else getattr(dit, k, d)  # noqa: E731
        return cls(hidden_size=int(get("hidden_size", 1920)), num_layers=int(get("num_layers", 30)),
                   num_heads=int(get("num_heads", 30)), head_dim=int(get("head_dim", 64)),
                   lora_rank=int(get("reference_lora_rank", 64)), lora_alpha=float(get("reference_lora_alpha", 64.0)),
                   param_dtype=str(get("param_dtype", "float32")))


def _uniform(key: Array, shape: tuple[int, ...], dtype: Any, fan_in: int) -> Array:
    bound = 1.0 / math.sqrt(fan_in)
    return jax.random.uniform(key, shape, dtype, -bound, bound)


class ReferenceLoRA(nnx.Module):
    """One layer's reference LoRA factors on the attention's q, k, v (``D -> N x H``) and out (``N x H -> D``)."""

    def __init__(self, cfg: ReferenceConfig, *, rngs: nnx.Rngs):
        D, N, H, r, pd = cfg.hidden_size, cfg.num_heads, cfg.head_dim, cfg.lora_rank, jnp.dtype(cfg.param_dtype)
        self.scaling = cfg.scaling
        ks = jax.random.split(rngs.params(), 4)
        for i, name in enumerate(("q", "k", "v")):
            setattr(self, f"{name}_a", LoRAParam(_uniform(ks[i], (D, r), pd, D), out_sharding=("embed", "lora")))
            setattr(self, f"{name}_b", LoRAParam(jnp.zeros((r, N, H), pd),
                                                 out_sharding=("lora", "heads", "head_dim")))
        self.out_a = LoRAParam(_uniform(ks[3], (N, H, r), pd, N * H), out_sharding=("heads", "head_dim", "lora"))
        self.out_b = LoRAParam(jnp.zeros((r, D), pd), out_sharding=("lora", "embed"))

    def update(self, name: str, x: Array, dtype: Any) -> Array:
        """The LoRA branch of projection ``name`` ("q", "k", "v": x [..., D] -> [..., N, H]; "out":
        x [..., N, H] -> [..., D]) in ``dtype``."""
        a, b = getattr(self, f"{name}_a")[...], getattr(self, f"{name}_b")[...]
        return low_rank_update(x, a, b, self.scaling, 2 if name == "out" else 1, dtype)


class ReferenceAdapter(nnx.Module):
    """The checkpoint component ``reference`` (module docstring): ``type_embed`` [D] and a stacked
    per-layer :class:`ReferenceLoRA` (leading "layers" axis), consumed by ``CogVideoXDiT.__call__(...,
    reference=latent, adapter=this)``."""

    def __init__(self, cfg: ReferenceConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        k_type, k_lora = jax.random.split(rngs.params())
        self.type_embed = nnx.Param(0.02 * jax.random.normal(k_type, (cfg.hidden_size,), jnp.dtype(cfg.param_dtype)),
                                    out_sharding=("embed",))

        @nnx.split_rngs(splits=cfg.num_layers)
        @nnx.vmap(in_axes=(0,), out_axes=0, transform_metadata={nnx.PARTITION_NAME: "layers"})
        def make(r: nnx.Rngs) -> ReferenceLoRA:
            return ReferenceLoRA(cfg, rngs=r)

        self.lora = make(nnx.Rngs(params=k_lora))


def encode_reference(vae: nnx.Module, images: Array, scaling_factor: float) -> Array:
    """Reference images -> the DiT's reference latent: uint8 [B, 8h, 8w, 3] (the clip's resolution) ->
    float32 [B, 1, C, h, w] = ``scaling_factor * mean(q(z | x))`` of the one-frame clip (x in [-1, 1]),
    the posterior mean (no sampling draw), so a reference gives the same latent in training and play.
    Traceable; ``vae`` is the system's frozen VAE (``CogVideoXVAE``)."""
    x = images.astype(jnp.float32)[:, None] / 255.0 * 2.0 - 1.0
    return (vae.encode(x).mean * float(scaling_factor)).astype(jnp.float32)
