"""The component builders: one function per network of a system, from the full config.

``COMPONENT_BUILDERS[name](config, rngs) -> nnx.Module`` builds the module a system checkpoint's
component ``name`` is restored into (animegamer_jax.checkpoint) and the module training starts
from (animegamer_jax.train). Each builder takes the whole ``ml_collections`` config and picks its
own sections; shapes follow the config only, so ``nnx.eval_shape(lambda: build(config,
nnx.Rngs(0)))`` gives the abstract state without allocating it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import ml_collections
from flax import nnx

from animegamer_jax.models.clip.model import CLIP
from animegamer_jax.models.cogvideox.dit import CogVideoXDiT, DiTConfig
from animegamer_jax.models.cogvideox.preview import PreviewDecoder
from animegamer_jax.models.cogvideox.character import COMPONENT as CHARACTERS
from animegamer_jax.models.cogvideox.reference import (ReferenceAdapter, ReferenceConfig, flat_factor_keys,
                                                       nested_factor_keys)
from animegamer_jax.models.cogvideox.vae import CogVideoXVAE
from animegamer_jax.models.mistral.mllm import GameStateMLLM
from animegamer_jax.models.shot_encoder.model import ShotEncoder
from animegamer_jax.models.t5.model import T5Encoder

Builder = Callable[[ml_collections.ConfigDict, nnx.Rngs], nnx.Module]


def build_mllm(config: ml_collections.ConfigDict, rngs: nnx.Rngs) -> nnx.Module:
    """The game-state MLLM (``GameStateMLLM``) from ``config.mllm`` and ``config.rep``."""
    return GameStateMLLM.from_config(config, rngs=rngs)


def build_dit(config: ml_collections.ConfigDict, rngs: nnx.Rngs) -> nnx.Module:
    """The video DiT from ``config.dit``; its text prefix is the ``rep.num_text_tokens +
    rep.num_image_tokens`` tokens of the representation s_a."""
    cfg = DiTConfig.from_config(config.dit,
                                text_length=int(config.rep.num_text_tokens + config.rep.num_image_tokens))
    return CogVideoXDiT(cfg, rngs=rngs)


def build_student(config: ml_collections.ConfigDict, rngs: nnx.Rngs) -> nnx.Module:
    """The distilled few-step student of the DiT (training phase d): the DiT of :func:`build_dit`
    with the guidance-scale embedding (``use_guidance``), played by ``diffusion.sampler="student"``."""
    cfg = DiTConfig.from_config(config.dit,
                                text_length=int(config.rep.num_text_tokens + config.rep.num_image_tokens))
    return CogVideoXDiT(dataclasses.replace(cfg, use_guidance=True), rngs=rngs)


def build_reference(config: ml_collections.ConfigDict, rngs: nnx.Rngs) -> nnx.Module:
    """The DiT's reference adapter (training phase r; models/cogvideox/reference.py) from ``config.dit``
    (``reference_lora_rank`` / ``reference_lora_alpha``): a system holding it plays characters from a
    reference image (docs/dit.md#reference-conditioning)."""
    return ReferenceAdapter(ReferenceConfig.from_config(config.dit), rngs=rngs)


def build_vae(config: ml_collections.ConfigDict, rngs: nnx.Rngs) -> nnx.Module:
    """The 3-D causal VAE from ``config.vae``."""
    return CogVideoXVAE.from_config(config.vae, rngs=rngs)


def build_preview(config: ml_collections.ConfigDict, rngs: nnx.Rngs) -> nnx.Module:
    """The preview decoder (training phase ``preview``; models/cogvideox/preview.py) from ``config.preview``
    and the VAE's latent sizes: a system holding it can show fast frames first (``game.decoder``)."""
    return PreviewDecoder.from_config(config, rngs=rngs)


def build_shot_encoder(config: ml_collections.ConfigDict, rngs: nnx.Rngs) -> nnx.Module:
    """The shot encoder E_a from ``config.shot_encoder`` and ``config.rep``."""
    return ShotEncoder.from_config(config, rngs=rngs)


def build_clip(config: ml_collections.ConfigDict, rngs: nnx.Rngs) -> nnx.Module:
    """CLIP from ``config.clip``."""
    return CLIP.from_config(config.clip, rngs=rngs)


def build_t5(config: ml_collections.ConfigDict, rngs: nnx.Rngs) -> nnx.Module:
    """The T5 encoder from ``config.t5``."""
    return T5Encoder.from_config(config.t5, rngs=rngs)


#: component name -> builder(config, rngs) -> module (the full config in; each builder picks its sections)
COMPONENT_BUILDERS: dict[str, Builder] = {
    "mllm": build_mllm,
    "dit": build_dit,
    "vae": build_vae,
    "shot_encoder": build_shot_encoder,
    "clip": build_clip,
    "t5": build_t5,
    "student": build_student,
    "reference": build_reference,
    "preview": build_preview,
}

#: components a system may hold besides :data:`COMPONENTS`: the few-step student (training phase d), the
#: reference adapter (training phase r; a system with it supports references, :func:`supports_references`)
#: and the preview decoder (training phase preview; :func:`supports_preview`)
OPTIONAL_COMPONENTS: tuple[str, ...] = ("student", "reference", "preview")

#: the component names of a whole system, in the order above (the optional ones not counted)
COMPONENTS: tuple[str, ...] = tuple(n for n in COMPONENT_BUILDERS if n not in OPTIONAL_COMPONENTS)


#: components that systems written before a change of their key layout store otherwise: name ->
#: (today's pure dict -> the stored layout, the stored layout -> today's); the checkpoint loader reads
#: through it when a stored component's keys are not today's (the reference and character LoRAs' factors
#: became ``LoRAFactors``: ``lora.q_a`` -> ``lora.q.lora_a``)
STORED_LAYOUTS: dict[str, tuple[Callable, Callable]] = {
    "reference": (flat_factor_keys, nested_factor_keys),
    CHARACTERS: (flat_factor_keys, nested_factor_keys),
}


def build_component(name: str, config: ml_collections.ConfigDict, rngs: nnx.Rngs) -> nnx.Module:
    """Builds component ``name`` from the full config.

    Raises:
      KeyError: ``name`` has no builder (the message lists the known ones).
    """
    if name not in COMPONENT_BUILDERS:
        raise KeyError(f"no builder for component {name!r}; known: {sorted(COMPONENT_BUILDERS)}")
    return COMPONENT_BUILDERS[name](config, rngs)


def supports_references(components) -> bool:
    """Whether a system with these component names (a system checkpoint manifest's ``components``)
    plays characters from a reference image: it holds the ``reference`` adapter (training phase r)."""
    return "reference" in tuple(components)


def supports_preview(components) -> bool:
    """Whether a system with these component names can decode previews (``game.decoder=preview`` or
    ``preview_then_full``): it holds the ``preview`` decoder (training phase preview)."""
    return "preview" in tuple(components)
