"""The model a training phase trains: :class:`TrainModel`, its trainable set and its :class:`PhaseSpec`.

Every phase trains one composite :class:`TrainModel` holding the components its record names
(``train.phases``: one module per phase, the table of components and trained sets in its docstring);
an NNX filter (:func:`trainable_filter`) picks the trained variables, so frozen components take no
gradient and no optimizer memory.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import ml_collections
from flax import nnx

from animegamer_jax.models import remat
from animegamer_jax.models.registry import build_component
from animegamer_jax.train import phases


#: ``train.remat="auto"``: the policies the compile tool compiles (animegamer-aot keeps the fastest roofline
#: step that fits 80 % of its chip's HBM, docs/sharding.md); "none" here turns every block scan's remat off
AUTO_REMAT: tuple[str, ...] = ("none", "save_dots", "full")


def with_remat(config: ml_collections.ConfigDict, policy: str) -> ml_collections.ConfigDict:
    """A copy of ``config`` training with remat ``policy`` in every MLLM / DiT block scan (``"none"`` also
    clears the sections' own ``remat``, which ``train.remat="none"`` keeps)."""
    c = copy.deepcopy(config)
    with c.unlocked():
        c.train.remat = policy
        if policy == "none":
            for section in ("mllm", "dit"):
                if "remat" in c[section]:
                    c[section].remat = "none"
    return c


def training_config(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """The config the train models are built from: fp32 master weights everywhere (activations keep
    the configured compute dtype), so the optimizer state is fp32 too; with ``train.remat`` every
    scanned block of the MLLM and DiT gets that remat policy (models/remat.py; "none" keeps the
    sections' own ``remat``; booleans of older configs: True = "full")."""
    c = copy.deepcopy(config)
    if str(config.train.get("remat", "none")).lower() == "auto":
        raise ValueError("train.remat='auto' is chosen by the compile tool: run animegamer-aot --topology=YOURS "
                         "--program=PHASE --config.train.remat=auto and pass the policy it prints "
                         f"(one of {AUTO_REMAT})")
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


def trainable_filter(phase: str, dit_trainable: str = "paper", *, component: str | None = None,
                     distill_trainable: str = "full") -> Any:
    """NNX filter of the variables trained in ``phase`` (its record's ``trainable``, ``train.phases``).

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
    if dit_trainable not in ("paper", "all"):
        raise ValueError(f"train.dit_trainable={dit_trainable!r}; use 'paper' or 'all'")
    if distill_trainable not in ("full", "lora"):
        raise ValueError(f"train.distill_trainable={distill_trainable!r}; use 'full' or 'lora'")
    filters = phases.phase(phase).trainable(dit_trainable, distill_trainable)
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
    rec = phases.phase(str(phase or config.train.phase))
    phase = rec.name
    comps = rec.components
    if bool(config.train.precomputed_features):
        comps = tuple(c for c in comps if c not in ("t5", "clip"))
    if rec.encode_latents and bool(config.train.encode_latents):
        comps = comps + ("vae",)
    tcfg = training_config(config)
    seed = int(config.seed if seed is None else seed)
    loss = rec.loss
    return PhaseSpec(
        phase=phase, components=comps,
        model_fn=lambda: TrainModel(tcfg, comps, rngs=nnx.Rngs(seed)),
        loss_fn=lambda model, batch, rng: loss(model, batch, rng, config),
        trainable=trainable_filter(phase, str(config.train.get("dit_trainable", "paper")),
                                   distill_trainable=str(config.train.get("distill_trainable", "full"))),
        outputs=rec.outputs)
