"""Named character LoRAs of the DiT: the checkpoint component ``characters`` (``character fit``).

Each stored character is one low-rank update of the DiT's attention projections (q, k, v and the
output projection of every layer), held as the reference adapter's per-layer set: a stacked
:class:`~animegamer_jax.models.cogvideox.reference.ReferenceLoRA` of the one LoRA factor class
(``q.lora_a`` [num_layers, D, r], ``q.lora_b`` [num_layers, r, N, H], ..., ``out.lora_a`` [num_layers, N, H, r],
``out.lora_b`` [num_layers, r, D], scaling ``alpha / r``). A turn that names the character samples with
the DiT whose attention kernels have that update folded in (:func:`merge_character`,
``LoRAFactors.delta``); every other turn samples with the DiT as it is.

The names, rank and alpha live in the system's manifest (``"characters": {"names": [...],
"lora_rank": r, "lora_alpha": alpha}``, :class:`CharacterSpec`); character i is ``loras[i]``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp
from flax import nnx

from animegamer_jax.models.cogvideox.reference import ReferenceConfig, ReferenceLoRA
from animegamer_jax.models.layers import stacked

#: the checkpoint component and the manifest key
COMPONENT = "characters"
#: the DiT attention projections a character LoRA updates, and their ReferenceLoRA factors
PROJECTIONS = (("to_q", "q"), ("to_k", "k"), ("to_v", "v"), ("to_out", "out"))


@dataclasses.dataclass(frozen=True)
class CharacterSpec:
    """The manifest's ``characters`` entry: stored names (in component order), LoRA rank and alpha."""

    names: tuple[str, ...]
    lora_rank: int = 4
    lora_alpha: float = 4.0

    def as_json(self) -> dict:
        return {"names": list(self.names), "lora_rank": self.lora_rank, "lora_alpha": self.lora_alpha}

    @classmethod
    def from_json(cls, entry: Mapping[str, Any] | None) -> "CharacterSpec":
        """From a manifest entry (None or {} -> no characters).

        Raises:
          ValueError: a malformed entry.
        """
        if not entry:
            return cls(())
        try:
            return cls(tuple(str(n) for n in entry["names"]), int(entry["lora_rank"]), float(entry["lora_alpha"]))
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"the manifest's 'characters' entry is malformed ({type(e).__name__}: {e})") from None

    def index(self, name: str) -> int | None:
        """The index of the stored character called ``name`` (case-insensitive), else None."""
        key = name.strip().casefold()
        return next((i for i, n in enumerate(self.names) if n.casefold() == key), None)


def _stacked(cfg: ReferenceConfig, rngs: nnx.Rngs) -> ReferenceLoRA:
    return stacked(cfg.num_layers, lambda r: ReferenceLoRA(cfg, rngs=r), rngs)


class CharacterLoRAs(nnx.Module):
    """The component ``characters``: ``loras`` = one stacked per-layer :class:`ReferenceLoRA` per
    stored character, in :class:`CharacterSpec` order."""

    def __init__(self, dit: Any, spec: CharacterSpec, *, rngs: nnx.Rngs):
        base = ReferenceConfig.from_config(dit)
        self.cfg = dataclasses.replace(base, lora_rank=spec.lora_rank, lora_alpha=spec.lora_alpha)
        self.spec = spec
        self.loras = nnx.List([_stacked(self.cfg, nnx.Rngs(params=rngs.params())) for _ in spec.names])


def factors_from_dit(dit: nnx.Module, cfg: ReferenceConfig) -> ReferenceLoRA:
    """A stacked :class:`ReferenceLoRA` holding the LoRA factors of a DiT built with ``lora_rank`` =
    ``cfg.lora_rank`` (its ``blocks.attn1.to_{q,k,v,out}.lora_{a,b}``): how ``character fit`` stores
    what it trained."""
    out = _stacked(cfg, nnx.Rngs(0))
    attn = dit.blocks.attn1
    for proj, short in PROJECTIONS:
        m, f = getattr(attn, proj), getattr(out, short)
        f.lora_a[...] = m.lora_a[...].astype(f.lora_a[...].dtype)
        f.lora_b[...] = m.lora_b[...].astype(f.lora_b[...].dtype)
    return out


def merge_character(dit: nnx.Module, lora: ReferenceLoRA) -> None:
    """Folds character ``lora`` into the LoRA-free DiT ``dit`` in place: each attention kernel
    ``W [num_layers, *in, *out]`` becomes ``W + (alpha/r) A . B`` (``LoRAFactors.delta``: fp32, stored in W's dtype).
    Traceable (play jits it once per stored character)."""
    attn = dit.blocks.attn1
    for proj, short in PROJECTIONS:
        k = getattr(attn, proj).kernel
        k[...] = (k[...].astype(jnp.float32) + getattr(lora, short).delta()).astype(k[...].dtype)

