"""The model a training phase trains: :class:`TrainModel`, its trainable set and its :class:`PhaseSpec`.

Every phase trains one composite :class:`TrainModel` holding the components it needs; an NNX filter
(:func:`trainable_filter`) picks the trained variables, so frozen components take no gradient and no
optimizer memory:

| phase | components (frozen in brackets)          | trained                                              |
|-------|------------------------------------------|------------------------------------------------------|
| a1    | shot_encoder, dit, [t5, clip, vae]       | E_a (all) + DiT ``flow_embed``                       |
| a2    | shot_encoder, dit, [t5, clip, vae]       | E_a + DiT LoRA + ``flow_embed`` + block adaLN        |
| b     | mllm, [shot_encoder, t5, clip]           | MLLM LoRA, RMSNorms, embeddings, lm_head, resamplers |
| c     | dit, [mllm, shot_encoder, t5, clip, vae] | DiT LoRA + ``flow_embed`` + block adaLN              |
| d     | student, [dit, shot_encoder, t5, clip, vae] | student: all, or LoRA + ``flow_embed`` + ``guidance_embed`` + block adaLN |
| vae   | vae                                      | VAE (all)                                            |
| r     | reference, [shot_encoder, dit, t5, clip, vae] | the reference adapter (type embedding + its LoRA) |
| preview | preview, [vae]                         | the preview decoder (all), distilled from the VAE decoder |

a1 follows the brief "E_a (+ motion embedding) against the frozen decoder" (the paper trains E_a
only; the release code also trains flow and LoRA, docs/training.md#trainable-sets). a2 and c train
the DiT's "joint" / "adaptation" sets (``models.cogvideox.dit.TRAINABLE_SETS``) plus its LoRA
factors; b trains the MLLM's LoRA factors and the parameters named in
``models.mistral.model.TRAINABLE_NAMES``; d (not in the paper: few-step sampling) trains the student
DiT (``train.distill_trainable``: "full" or "lora") against the frozen teacher ``dit``.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from typing import Any

import ml_collections
from flax import nnx

from animegamer_jax.config import TRAIN_PHASES
from animegamer_jax.models import remat
from animegamer_jax.models.cogvideox import dit as cogvideox_dit
from animegamer_jax.models.lora import LoRAParam
from animegamer_jax.models.mistral import model as mistral_model
from animegamer_jax.models.registry import build_component
from animegamer_jax.train import losses

PHASES: tuple[str, ...] = TRAIN_PHASES  # config.validate checks train.phase against the same names

#: components held by each phase's TrainModel (frozen or not), in build order
PHASE_COMPONENTS: dict[str, tuple[str, ...]] = {
    "a1": ("shot_encoder", "dit", "t5", "clip"),
    "a2": ("shot_encoder", "dit", "t5", "clip"),
    "b": ("mllm", "shot_encoder", "t5", "clip"),
    "c": ("mllm", "shot_encoder", "dit", "t5", "clip"),
    "d": ("shot_encoder", "dit", "student", "t5", "clip"),
    "vae": ("vae",),
    "r": ("shot_encoder", "dit", "t5", "clip", "vae", "reference"),
    "preview": ("vae", "preview"),
}

#: components whose weights each phase changes (written to the system checkpoint after it)
PHASE_OUTPUTS: dict[str, tuple[str, ...]] = {
    "a1": ("shot_encoder", "dit"), "a2": ("shot_encoder", "dit"), "b": ("mllm",), "c": ("dit",), "d": ("student",),
    "vae": ("vae",), "r": ("reference",), "preview": ("preview",)}


def training_config(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """The config the train models are built from: fp32 master weights everywhere (activations keep
    the configured compute dtype), so the optimizer state is fp32 too; with ``train.remat`` every
    scanned block of the MLLM and DiT gets that remat policy (models/remat.py; "none" keeps the
    sections' own ``remat``; booleans of older configs: True = "full")."""
    c = copy.deepcopy(config)
    policy = remat.policy_name(config.train.get("remat", "none"))
    with c.unlocked(), c.ignore_type():
        for section in ("mllm", "dit"):  # the student is built from the dit section
            if "param_dtype" in c[section]:
                c[section].param_dtype = "float32"
            if policy != "none":
                c[section].remat = policy
    return c


class TrainModel(nnx.Module):
    """Container of the components a phase needs (attributes named as in the system checkpoint), each
    built by ``models.registry.build_component`` from ``config``."""

    def __init__(self, config: ml_collections.ConfigDict, components: tuple[str, ...], *, rngs: nnx.Rngs):
        self.component_names = tuple(components)
        for name in components:
            setattr(self, name, build_component(name, config, rngs))


def _under(prefix: str, inner: Any = None) -> Any:
    """Filter: variables under attribute ``prefix`` of the TrainModel (and matching ``inner``)."""

    def under(path: tuple[Any, ...], value: Any) -> bool:
        if not path or str(path[0]) != prefix:
            return False
        if inner is None:
            return isinstance(value, nnx.Param)
        return nnx.filterlib.to_predicate(inner)(path[1:], value)

    return under


def _path_has(names: frozenset[str] | tuple[str, ...]) -> Callable[[tuple[Any, ...], Any], bool]:
    """Filter: variables with a path part (attribute name) in ``names``."""

    def has(path: tuple[Any, ...], _value: Any) -> bool:
        return any(str(part) in names for part in path)

    return has


def _component_filters(phase: str, dit_trainable: str, distill_trainable: str = "full") -> dict[str, Any]:
    """``{component: NNX filter relative to that component}`` of the variables ``phase`` trains."""
    if dit_trainable not in ("paper", "all"):
        raise ValueError(f"train.dit_trainable={dit_trainable!r}; use 'paper' or 'all'")
    if distill_trainable not in ("full", "lora"):
        raise ValueError(f"train.distill_trainable={distill_trainable!r}; use 'full' or 'lora'")

    def dit_set(name: str) -> Any:
        # LoRA factors always train (SAT disable_untrainable_params); the block adaLN (blocks.adaln) is
        # in the set, the final layer's adaLN (out_adaln_*) is not
        return nnx.Any(LoRAParam, nnx.All(nnx.Param, _path_has(cogvideox_dit.TRAINABLE_SETS[name])))

    if phase == "a1":
        return {"shot_encoder": nnx.Param, "dit": nnx.All(nnx.Param, _path_has(("flow_embed",)))}
    if phase == "a2":
        return {"shot_encoder": nnx.Param, "dit": nnx.Param if dit_trainable == "all" else dit_set("joint")}
    if phase == "b":
        return {"mllm": nnx.Any(LoRAParam, nnx.All(nnx.Param, _path_has(mistral_model.TRAINABLE_NAMES)))}
    if phase == "c":
        return {"dit": dit_set("adaptation")}
    if phase == "d":
        return {"student": nnx.Param if distill_trainable == "full" else nnx.Any(
            dit_set("adaptation"), nnx.All(nnx.Param, _path_has(("guidance_embed",))))}
    if phase == "vae":
        return {"vae": nnx.Param}
    if phase == "r":  # the DiT and E_a stay as they are: with no reference the decoder is unchanged
        return {"reference": nnx.Param}
    if phase == "preview":  # the VAE is the frozen teacher (its encoder gives the latents, its decoder the target)
        return {"preview": nnx.Param}
    raise ValueError(f"unknown training phase {phase!r}; use one of {PHASES}")


def trainable_filter(phase: str, dit_trainable: str = "paper", *, component: str | None = None,
                     distill_trainable: str = "full") -> Any:
    """NNX filter of the variables trained in ``phase`` (module docstring's table).

    Paths are relative to :class:`TrainModel` (``nnx.state(train_model, filter)``), or, with
    ``component`` (``"shot_encoder"``, ``"dit"``, ``"mllm"``, ``"vae"``), relative to that one
    component's module: e.g. ``trainable_filter("a2", component="dit")`` on a bare DiT. Phase b's
    MLLM filter matches parameter names only, so it also selects the paper's set of a bare Mistral.

    ``dit_trainable`` (``config.train.dit_trainable``) picks the DiT set of phase a2: ``"paper"``
    trains the paper's / release's set (LoRA + ``flow_embed`` + block adaLN on top of the pretrained
    CogVideoX); ``"all"`` trains every DiT parameter, for toy configs that have no pretrained
    CogVideoX to adapt (configs/tiny.py: a random base under LoRA draws noise). Phases a1 and c keep
    their sets either way. ``distill_trainable`` picks phase d's student set: "full" (every student
    parameter) or "lora" (its LoRA factors, ``flow_embed``, ``guidance_embed`` and block adaLN).

    Raises:
      ValueError: unknown phase or ``dit_trainable``, or a ``component`` the phase does not train.
    """
    filters = _component_filters(phase, dit_trainable, distill_trainable)
    if component is not None:
        if component not in filters:
            raise ValueError(f"phase {phase!r} trains {tuple(filters)}, not {component!r}")
        return filters[component]
    under = [_under(name, inner) for name, inner in filters.items()]
    return under[0] if len(under) == 1 else nnx.Any(*under)


@dataclasses.dataclass
class PhaseSpec:
    """Everything :func:`animegamer_jax.train.loop.Trainer` needs for one phase."""

    phase: str
    components: tuple[str, ...]
    model_fn: Any
    loss_fn: Any
    trainable: Any
    outputs: tuple[str, ...]


def phase_spec(config: ml_collections.ConfigDict, phase: str | None = None, seed: int | None = None) -> PhaseSpec:
    """The model builder, loss and trainable filter of ``phase`` (default ``config.train.phase``).

    With ``config.train.encode_latents`` the VAE joins the decoder phases (frames are encoded in the
    step); otherwise batches must carry ``latents``. With ``config.train.precomputed_features`` T5 and
    CLIP stay out of the model and batches carry ``f_md`` / ``f_v`` (``turn_f_md`` / ``turn_f_v``).

    Raises:
      ValueError: unknown phase.
    """
    phase = str(phase or config.train.phase)
    if phase not in PHASES:
        raise ValueError(f"unknown training phase {phase!r}; use one of {PHASES}")
    comps = PHASE_COMPONENTS[phase]
    if bool(config.train.precomputed_features):
        comps = tuple(c for c in comps if c not in ("t5", "clip"))
    if phase in ("a1", "a2", "c", "d") and bool(config.train.encode_latents):
        comps = comps + ("vae",)
    tcfg = training_config(config)
    seed = int(config.seed if seed is None else seed)
    loss = losses.LOSSES[phase]
    return PhaseSpec(
        phase=phase, components=comps,
        model_fn=lambda: TrainModel(tcfg, comps, rngs=nnx.Rngs(seed)),
        loss_fn=lambda model, batch, rng: loss(model, batch, rng, config),
        trainable=trainable_filter(phase, str(config.train.get("dit_trainable", "paper")),
                                   distill_trainable=str(config.train.get("distill_trainable", "full"))),
        outputs=PHASE_OUTPUTS[phase])
