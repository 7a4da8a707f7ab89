"""Deprecated alias of the training-phase modules (removed next release).

The phases' code lives in :mod:`animegamer_jax.train.model` (TrainModel, trainable_filter,
phase_spec), :mod:`animegamer_jax.train.losses` (the losses), :mod:`animegamer_jax.train.batches`
(BatchBuilder, the VAE curriculum) and :mod:`animegamer_jax.train.samples` (sample videos).
"""

from animegamer_jax.train.batches import BatchBuilder, _strs, flow_values, vae_stage, vae_windows  # noqa: F401
from animegamer_jax.train.losses import (  # noqa: F401
    LOSSES,
    _diffusion_loss,
    _encode_features,
    _latents,
    _mllm_batch,
    _turn_reps,
    adaptation_loss,
    decoder_loss,
    ea_representation,
    latent_scaling_factor,
    mllm_loss,
    vae_decode_plan,
    vae_loss,
)
from animegamer_jax.train.model import (  # noqa: F401
    PHASE_COMPONENTS,
    PHASE_OUTPUTS,
    PHASES,
    PhaseSpec,
    TrainModel,
    _under,
    build_component,
    num_queries,
    phase_spec,
    trainable_filter,
    training_config,
)
from animegamer_jax.train.samples import sample_hook, sample_video  # noqa: F401
