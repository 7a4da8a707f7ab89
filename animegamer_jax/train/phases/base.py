"""The record of one training phase (:class:`Phase`) and the NNX filters its trainable set is made of.

A phase's ``trainable(dit_trainable, distill_trainable)`` returns ``{component: NNX filter relative to
that component}``; ``train.model.trainable_filter`` validates the two settings and joins the filters
over the ``TrainModel``'s attributes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import ml_collections
from flax import nnx

from animegamer_jax.models.cogvideox import dit as cogvideox_dit
from animegamer_jax.models.lora import LoRAParam
from animegamer_jax.train.losses import LossFn

#: ``(dit_trainable, distill_trainable) -> {component: NNX filter relative to that component}``
TrainableFn = Callable[[str, str], dict[str, Any]]


def _no_settings(config: ml_collections.ConfigDict) -> dict[str, Any]:
    return {}


@dataclasses.dataclass(frozen=True)
class Phase:
    """One training phase, as the train command (``train.model.phase_spec``, ``train.pipeline``) and
    the compile tool (``aot.programs``) read it.

    Attributes:
      name: the phase's name (``config.train.phase``, ``config.train.pipeline``, ``animegamer-aot --program``).
      components: the components its ``TrainModel`` holds (frozen or not), in build order, with the
        frozen T5 and CLIP (left out with ``train.precomputed_features``).
      outputs: the components whose weights it changes (written to the system checkpoint after it).
      trainable: its trainable set (:data:`TrainableFn`).
      loss: ``train.losses`` function of its step.
      batch: the ``data.batches.BatchBuilder`` kind of its batches (``data.batches.BATCH_KINDS``).
      loader: the ``data.loader`` mode it reads ("clips" or "turns").
      schedule: (peak learning rate, optimizer steps) when ``train.learning_rate`` / ``num_steps`` are 0.
      encode_latents: with ``train.encode_latents`` the VAE joins its model (frames encoded in the step).
      samples: ``train.sample_every`` writes sample videos of it (when its model holds the VAE).
      batch_settings: ``config -> {name: value}``, the settings its batches depend on that a resume must
        agree on (``train.pipeline.run_meta``).
      dataset_key: the ``config.train`` field naming its own prepared dataset when set (else
        ``config.data.dataset_dir``).
    """

    name: str
    components: tuple[str, ...]
    outputs: tuple[str, ...]
    trainable: TrainableFn
    loss: LossFn
    batch: str
    loader: str
    schedule: tuple[float, int]
    encode_latents: bool = False
    samples: bool = False
    batch_settings: Callable[[ml_collections.ConfigDict], dict[str, Any]] = _no_settings
    dataset_key: str = ""


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
