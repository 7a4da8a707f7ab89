"""Classifier-free guidance: DynamicCFG scale schedules and training-time condition dropout.

DynamicCFG (docs/diffusion.md#guidance): `s(step) = 1 + scale * (1 - cos(pi * (step / num_steps)^exp)) / 2`,
applied to the x0-predictions `D = D_u + s (D_c - D_u)` (equivalent to CFG on v, D being linear in v).
  * "intended" (our default): step = loop index i = 0..n-1, a smooth rise from 1 to ~6.86 for n = 50.
  * "release": step = num_steps - tau_i with tau the DDPM index (what the released sampler computes),
    which gives the erratic scales of docs/diffusion.md#guidance; diffusers
    `CogVideoXPipeline(use_dynamic_cfg=True)` uses the same expression (`num_inference_steps - t`).
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

CFG_SCHEDULES = ("intended", "release", "constant")


def dynamic_cfg_rise(num_steps: int, timesteps: np.ndarray, exp: float = 5.0, schedule: str = "intended") -> np.ndarray:
    """``g_i = (1 - cos(pi * (step_i / num_steps)^exp)) / 2`` per step (float64 [num_steps]), so that the
    DynamicCFG scale of a run with scale ``w`` is ``1 + w g_i`` (:func:`dynamic_cfg_scales`); the
    "constant" schedule has no rise (None is not returned: use :func:`cfg_scales_of` for it).

    Raises:
      ValueError: unknown schedule, or "constant".
    """
    if schedule == "intended":
        steps = np.arange(num_steps, dtype=np.float64)
    elif schedule == "release":
        steps = num_steps - np.asarray(timesteps, np.float64)
    else:
        raise ValueError(f"CFG schedule {schedule!r} has no rise; use one of {CFG_SCHEDULES[:2]}")
    # Python float power keeps (negative)^5 real, as in the reference's `(step / num_steps) ** exp`.
    return np.array([(1.0 - math.cos(math.pi * (float(s) / num_steps) ** exp)) / 2.0 for s in steps])


def dynamic_cfg_scales(num_steps: int, timesteps: np.ndarray, scale: float = 6.0, exp: float = 5.0,
                       schedule: str = "intended") -> np.ndarray:
    """Per-step guidance scales (float64 [num_steps]), computed in float64 like the Python reference.

    Args:
      num_steps: sampling steps.
      timesteps: [num_steps] DDPM indices tau_i of the steps, highest noise first (used by "release").
      scale / exp: DynamicCFG `scale` (6) and `exp` (5).
      schedule: "intended" (loop index), "release" (num_steps - tau), or "constant" (s = scale every step).

    Raises:
      ValueError: unknown schedule.
    """
    if schedule == "constant":
        return np.full(num_steps, float(scale))
    if schedule not in CFG_SCHEDULES:
        raise ValueError(f"unknown CFG schedule {schedule!r}; use one of {CFG_SCHEDULES}")
    return 1.0 + float(scale) * dynamic_cfg_rise(num_steps, timesteps, exp, schedule)


def cfg_scales_of(scale: jax.Array, num_steps: int, timesteps: np.ndarray, exp: float = 5.0,
                  schedule: str = "intended") -> jax.Array:
    """:func:`dynamic_cfg_scales` for traced scales: ``scale`` float [B] -> float32 [B, num_steps]
    (phase d draws a DynamicCFG scale per sample and distils the run it defines).

    Raises:
      ValueError: unknown schedule.
    """
    scale = jnp.asarray(scale, jnp.float32)[:, None]
    if schedule == "constant":
        return jnp.broadcast_to(scale, (scale.shape[0], num_steps))
    if schedule not in CFG_SCHEDULES:
        raise ValueError(f"unknown CFG schedule {schedule!r}; use one of {CFG_SCHEDULES}")
    return 1.0 + scale * jnp.asarray(dynamic_cfg_rise(num_steps, timesteps, exp, schedule), jnp.float32)[None]


def cfg_dropout(key: jax.Array, cond: Any, uncond: Any, rate: float) -> Any:
    """Per-sample condition dropout for CFG training (docs/diffusion.md#training-loss).

    Args:
      key: PRNG key.
      cond: pytree of arrays with leading batch dim B.
      uncond: matching pytree of the unconditional values, with leading dim B or 1 (broadcast),
        e.g. zeros, or the bias-only E_a output of zero inputs (docs/encoders.md#unconditional-embedding).
      rate: probability that a sample's condition is replaced (0.05 text, 0.05 image, 0.1 ucg).

    Returns:
      (pytree like `cond`, bool [B] mask of dropped samples).
    """
    leaves = jax.tree.leaves(cond)
    b = leaves[0].shape[0]
    drop = jax.random.bernoulli(key, rate, (b,))

    def pick(c, u):
        m = drop.reshape((b,) + (1,) * (c.ndim - 1))
        return jnp.where(m, jnp.broadcast_to(u, c.shape).astype(c.dtype), c)

    return jax.tree.map(pick, cond, uncond), drop
