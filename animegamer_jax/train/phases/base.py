"""The record of one training phase (:class:`Phase`) and the NNX filters its trainable set is made of.

A phase's ``trainable`` maps each component it trains to an NNX filter relative to that component, or
to a :class:`Choice` of filters by a ``config.train`` setting; ``train.model.trainable_filter``
validates the settings and joins the filters over the ``TrainModel``'s attributes.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from typing import Any

import ml_collections
from flax import nnx

from animegamer_jax.data.batches import BatchKind
from animegamer_jax.models.cogvideox import dit as cogvideox_dit
from animegamer_jax.models.layers import LoRAParam
from animegamer_jax.train.losses import LossFn


def _no_settings(config: ml_collections.ConfigDict) -> dict[str, Any]:
    return {}


@dataclasses.dataclass(frozen=True)
class Choice:
    """A trained set picked by a ``config.train`` setting: ``filters[config.train[setting]]``."""

    setting: str  # "dit_trainable" or "distill_trainable"
    filters: Mapping[str, Any]


@dataclasses.dataclass(frozen=True)
class Phase:
    """One training phase, as the train command (``train.model.phase_trainer``, ``train.pipeline``) and
    the compile tool (``aot.programs``) read it.

    Attributes:
      name: the phase's name (``config.train.phase``, ``config.train.pipeline``, ``animegamer-aot --program``).
      components: the components its ``TrainModel`` holds (frozen or not), in build order, with the
        frozen T5 and CLIP (left out with ``train.precomputed_features``).
      trainable: ``{component: NNX filter relative to it, or a Choice}``; its keys are the components
        whose weights it changes (:attr:`outputs`).
      loss: the ``train.losses`` function of its step (:meth:`step_loss` binds the config).
      batch: the ``data.batches.BatchKind`` of its batches (which also names the loader mode).
      schedule: (peak learning rate, optimizer steps) when ``train.learning_rate`` / ``num_steps`` are 0.
      samples: ``train.sample_every`` writes sample videos of it (when its model holds the VAE).
      settings: ``config -> {name: value}``, settings of its runs beyond its batch kind's that a resume
        must agree on (:meth:`run_settings`).
    """

    name: str
    components: tuple[str, ...]
    trainable: Mapping[str, Any]
    loss: LossFn
    batch: BatchKind
    schedule: tuple[float, int]
    samples: bool = False
    settings: Callable[[ml_collections.ConfigDict], dict[str, Any]] = _no_settings

    @property
    def outputs(self) -> tuple[str, ...]:
        """The components whose weights it changes (written to the system checkpoint after it)."""
        return tuple(self.trainable)

    def components_for(self, config: ml_collections.ConfigDict) -> tuple[str, ...]:
        """The components its ``TrainModel`` holds under ``config``: T5 and CLIP leave with
        ``train.precomputed_features`` (batches carry their features); the VAE joins a phase whose batches
        carry a target clip with ``train.encode_latents`` (frames encoded in the step)."""
        comps = self.components
        if bool(config.train.precomputed_features):
            comps = tuple(c for c in comps if c not in ("t5", "clip"))
        if self.batch.clip_target and bool(config.train.encode_latents) and "vae" not in comps:
            comps = comps + ("vae",)
        return comps

    def filters(self, settings: Mapping[str, str]) -> dict[str, Any]:
        """``{component: NNX filter}`` with each :class:`Choice` picked by ``settings[choice.setting]``."""
        return {c: f.filters[settings[f.setting]] if isinstance(f, Choice) else f for c, f in self.trainable.items()}

    def run_settings(self, config: ml_collections.ConfigDict) -> dict[str, Any]:
        """The settings of its batches (``batch.settings``) and runs (``settings``) a resume must agree on."""
        return {**self.batch.settings(config), **self.settings(config)}

    def step_loss(self, config: ml_collections.ConfigDict) -> Callable[..., Any]:
        """Its loss as ``train.loop.Trainer`` calls it: ``(model, batch, rng) -> (loss, metrics)`` under ``config``."""
        return functools.partial(self.loss, config=config)


def path_has(names: frozenset[str] | tuple[str, ...]) -> Callable[[tuple[Any, ...], Any], bool]:
    """Filter: variables with a path part (attribute name) in ``names``."""

    def has(path: tuple[Any, ...], _value: Any) -> bool:
        return any(str(part) in names for part in path)

    return has


def dit_set(name: str) -> Any:
    """Filter of the DiT's trainable set ``name`` (``models.cogvideox.dit.TRAINABLE_SETS``) plus every
    LoRA factor (LoRA factors always train, as SAT's disable_untrainable_params); the block adaLN
    (``blocks.adaln``) is in the sets, the final layer's adaLN (``out_adaln_*``) is not."""
    return nnx.Any(LoRAParam, nnx.All(nnx.Param, path_has(cogvideox_dit.TRAINABLE_SETS[name])))
