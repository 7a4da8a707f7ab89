"""Model-agnostic diffusion: schedule, v-prediction losses, samplers, guidance (docs/diffusion.md)."""

from animegamer_jax.diffusion.guidance import cfg_dropout, dynamic_cfg_scales
from animegamer_jax.diffusion.losses import (
    a_of,
    add_noise,
    sample_timesteps,
    training_inputs,
    v_prediction_loss,
    v_target,
    x0_from_v,
)
from animegamer_jax.diffusion.samplers import SamplerPlan, make_plan, plan_from_config, sample
from animegamer_jax.diffusion.schedules import DiffusionSchedule

__all__ = [
    "DiffusionSchedule", "SamplerPlan", "a_of", "add_noise", "cfg_dropout", "dynamic_cfg_scales",
    "make_plan", "plan_from_config", "sample", "sample_timesteps", "training_inputs", "v_prediction_loss",
    "v_target", "x0_from_v",
]
