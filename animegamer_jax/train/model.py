"""The model a training phase trains: :class:`TrainModel`, its trainable set and its step (:func:`phase_trainer`).

Every phase trains one composite :class:`TrainModel` holding the components its record names
(``train.phases``: one module per phase, the table of components and trained sets in its docstring);
an NNX filter (:func:`trainable_filter`) picks the trained variables, so frozen components take no
gradient and no optimizer memory.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import ml_collections
from flax import nnx

from animegamer_jax import parallel
from animegamer_jax.models import remat
from animegamer_jax.models.registry import build_component
from animegamer_jax.parallel import xla_flags
from animegamer_jax.train import loop, optim, phases


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
    filters = phases.phase(phase).filters({"dit_trainable": dit_trainable, "distill_trainable": distill_trainable})
    if component is not None:
        if component not in filters:
            raise ValueError(f"phase {phase!r} trains {tuple(filters)}, not {component!r}")
        return filters[component]
    under = [_under(name, inner) for name, inner in filters.items()]
    return under[0] if len(under) == 1 else nnx.Any(*under)


def phase_model(config: ml_collections.ConfigDict, phase: str | None = None,
                seed: int | None = None) -> Callable[[], TrainModel]:
    """``() -> TrainModel`` of ``phase`` (default ``config.train.phase``): the components its record holds
    under ``config`` (``Phase.components_for``), built from :func:`training_config`, each call with fresh
    ``nnx.Rngs(seed)`` (default ``config.seed``), so every call makes the same initial weights.

    Raises:
      ValueError: unknown phase.
    """
    comps = phases.phase(str(phase or config.train.phase)).components_for(config)
    tcfg = training_config(config)
    seed = int(config.seed if seed is None else seed)

    def build() -> TrainModel:
        return TrainModel(tcfg, comps, rngs=nnx.Rngs(seed))

    return build


def phase_filter(config: ml_collections.ConfigDict, phase: str | None = None) -> Any:
    """:func:`trainable_filter` of ``phase`` (default ``config.train.phase``) with ``config``'s
    ``train.dit_trainable`` and ``train.distill_trainable``."""
    return trainable_filter(str(phase or config.train.phase), str(config.train.get("dit_trainable", "paper")),
                            distill_trainable=str(config.train.get("distill_trainable", "full")))


def phase_trainer(config: ml_collections.ConfigDict, mesh: Any, rules: Any = parallel.DEFAULT_RULES, *,
                  compiler_options: dict[str, Any] | None = None) -> loop.Trainer:
    """The train command's step of ``config.train.phase`` on ``mesh``: a ``loop.Trainer`` on
    :func:`phase_model`, the phase's loss (``Phase.step_loss``), :func:`phase_filter` and the optimizer of
    ``config.train`` (``optim.make_optimizer``), with ``train.grad_accum_steps``, ``config.seed`` and the
    compile options of ``mesh`` (``parallel.xla_flags.train_compile_options``, then ``compiler_options``).

    With ``config.train.encode_latents`` the VAE joins the phases whose batches carry a target clip
    (frames are encoded in the step); otherwise batches must carry ``latents``. With
    ``config.train.precomputed_features`` T5 and CLIP stay out of the model and batches carry ``f_md`` /
    ``f_v`` (``turn_f_md`` / ``turn_f_v``).

    Raises:
      ValueError: unknown phase.
    """
    rec = phases.phase(str(config.train.phase))
    tx, sched = optim.make_optimizer(config.train)
    return loop.Trainer(phase_model(config), rec.step_loss(config), tx, phase_filter(config), mesh, rules, schedule=sched,
                        grad_accum_steps=int(config.train.grad_accum_steps), seed=int(config.seed),
                        compiler_options=xla_flags.train_compile_options(config, mesh, compiler_options))
