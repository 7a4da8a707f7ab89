"""The DiT's reference adapter: play a character from one reference image (training phase r).

A reference image, VAE-encoded as ONE latent frame ``[B, 1, C, h, w]`` (scaled like the clip's
latents, :func:`encode_reference`), joins the DiT's sequence as extra video tokens (Concat-ID-style
concatenation, docs/dit.md#reference-conditioning): it is patchified with the DiT's own patch
embedding, gets the frame-0 spatial sin-cos position of the video tokens plus this adapter's learned
``type_embed`` [D], and is appended after the video tokens; the DiT drops those tokens before its
output layer. While a reference is given, this adapter's own LoRA set (``lora`` per layer: the one
LoRA factor class ``models.layers.LoRAFactors`` for q, k, v and the output projection) is added to the
DiT's attention projections for every token. Without a reference the DiT never touches the adapter,
so its output is exactly that of a DiT without one.

Parameters (docs/design.md#dimension-letters: ``D`` width, ``N`` heads, ``H`` head dim, ``r`` =
``reference_lora_rank``): ``type_embed`` [D]; ``lora.{q,k,v}.lora_a`` [num_layers, D, r],
``lora.{q,k,v}.lora_b`` [num_layers, r, N, H], ``lora.out.lora_a`` [num_layers, N, H, r], ``lora.out.lora_b``
[num_layers, r, D] (the B factors start at zero, so a fresh adapter changes the attention weights by
nothing and the reference acts through attention alone). Systems stored before the factors were
``LoRAFactors`` name them ``lora.q_a``, ...: they load through :func:`flat_factor_keys`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from animegamer_jax.models.layers import LoRAFactors, stacked

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


#: the attention projections a reference or character LoRA updates (``q``, ``k``, ``v``: D -> N x H;
#: ``out``: N x H -> D)
PROJECTIONS = ("q", "k", "v", "out")


class ReferenceLoRA(nnx.Module):
    """One layer's LoRA of the DiT's attention: a :class:`~animegamer_jax.models.layers.LoRAFactors` per
    projection of :data:`PROJECTIONS` (the reference adapter's, and each stored character's)."""

    def __init__(self, cfg: ReferenceConfig, *, rngs: nnx.Rngs):
        D, N, H, pd = cfg.hidden_size, cfg.num_heads, cfg.head_dim, jnp.dtype(cfg.param_dtype)
        embed, heads = ((D,), ("embed",)), ((N, H), ("heads", "head_dim"))
        for key, name in zip(jax.random.split(rngs.params(), 4), PROJECTIONS):
            (ins, in_axes), (outs, out_axes) = (heads, embed) if name == "out" else (embed, heads)
            setattr(self, name, LoRAFactors(ins, outs, in_axes=in_axes, out_axes=out_axes, rank=cfg.lora_rank,
                                            alpha=cfg.lora_alpha, param_dtype=pd, rngs=key))

    def update(self, name: str, x: Array, dtype: Any) -> Array:
        """The LoRA branch of projection ``name`` ("q", "k", "v": x [..., D] -> [..., N, H]; "out":
        x [..., N, H] -> [..., D]) in ``dtype``."""
        return getattr(self, name).update(x, dtype)


def flat_factor_keys(tree: Any) -> Any:
    """A pure dict of the ``reference`` or ``characters`` component in the layout stored before their
    factors were :class:`LoRAFactors`: ``{"q": {"lora_a": A, "lora_b": B}, ...}`` -> ``{"q_a": A, "q_b": B,
    ...}`` wherever it occurs (``models.registry.STORED_LAYOUTS``: the checkpoint loader reads such
    systems through it)."""
    if not isinstance(tree, dict):
        return tree
    if set(tree) == set(PROJECTIONS) and all(isinstance(v, dict) and set(v) == {"lora_a", "lora_b"}
                                             for v in tree.values()):
        return {f"{n}_{s}": tree[n][f"lora_{s}"] for n in PROJECTIONS for s in "ab"}
    return {k: flat_factor_keys(v) for k, v in tree.items()}


def nested_factor_keys(tree: Any) -> Any:
    """The inverse of :func:`flat_factor_keys`: ``{"q_a": A, "q_b": B, ...}`` -> ``{"q": {"lora_a": A,
    "lora_b": B}, ...}`` wherever it occurs."""
    if not isinstance(tree, dict):
        return tree
    if set(tree) == {f"{n}_{s}" for n in PROJECTIONS for s in "ab"}:
        return {n: {f"lora_{s}": tree[f"{n}_{s}"] for s in "ab"} for n in PROJECTIONS}
    return {k: nested_factor_keys(v) for k, v in tree.items()}


class ReferenceAdapter(nnx.Module):
    """The checkpoint component ``reference`` (module docstring): ``type_embed`` [D] and a stacked
    per-layer :class:`ReferenceLoRA` (leading "layers" axis), consumed by ``CogVideoXDiT.__call__(...,
    reference=latent, adapter=this)``."""

    def __init__(self, cfg: ReferenceConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        k_type, k_lora = jax.random.split(rngs.params())
        self.type_embed = nnx.Param(0.02 * jax.random.normal(k_type, (cfg.hidden_size,), jnp.dtype(cfg.param_dtype)),
                                    out_sharding=("embed",))
        self.lora = stacked(cfg.num_layers, lambda r: ReferenceLoRA(cfg, rngs=r), nnx.Rngs(params=k_lora))


def encode_reference(vae: nnx.Module, images: Array, scaling_factor: float) -> Array:
    """Reference images -> the DiT's reference latent: uint8 [B, 8h, 8w, 3] (the clip's resolution) ->
    float32 [B, 1, C, h, w] = ``scaling_factor * mean(q(z | x))`` of the one-frame clip (x in [-1, 1]),
    the posterior mean (no sampling draw), so a reference gives the same latent in training and play.
    Traceable; ``vae`` is the system's frozen VAE (``CogVideoXVAE``)."""
    x = images.astype(jnp.float32)[:, None] / 255.0 * 2.0 - 1.0
    return (vae.encode(x).mean * float(scaling_factor)).astype(jnp.float32)
