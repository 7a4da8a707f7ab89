"""v-prediction parameterization, noising, timestep sampling and the training loss.

Facts: docs/diffusion.md#v-prediction, docs/diffusion.md#training-loss.

With `a = sqrt(alpha_bar_tau)` and `sigma = sqrt(1 - a^2)`:
  x_t = a x_0 + sigma eps,  v = a eps - sigma x_0,  D(x_t) = a x_t - sigma v_pred  (SAT `VideoScaling`).
SAT's `VideoDiffusionLoss` is `mean(w (D - x_0)^2)` with `w = 1 / sigma^2`; since `D - x_0 = sigma (v - v_pred)`
this is exactly the MSE on v, which is how it is computed here (no division by sigma near tau = 0).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from animegamer_jax.diffusion.schedules import DiffusionSchedule


def _bcast(a: jax.Array, x: jax.Array) -> jax.Array:
    return a.reshape(a.shape + (1,) * (x.ndim - a.ndim))


def sample_timesteps(key: jax.Array, batch: int, num_train_timesteps: int = 1000) -> jax.Array:
    """Uniform DDPM indices in [0, num_train) (SAT `DiscreteSampling(uniform_sampling=True)`), int32 [B]."""
    return jax.random.randint(key, (batch,), 0, num_train_timesteps, dtype=jnp.int32)


def a_of(timesteps: jax.Array, schedule: DiffusionSchedule = DiffusionSchedule()) -> jax.Array:
    """Training-table sqrt(alpha_bar) at integer `timesteps` [B], float32 [B]."""
    return jnp.asarray(schedule.train_a(), jnp.float32)[timesteps]


def add_noise(x0: jax.Array, noise: jax.Array, a: jax.Array) -> jax.Array:
    """x_t = a x0 + sqrt(1 - a^2) noise; x0, noise [B, ...], a [B]."""
    a = _bcast(a, x0)
    return a * x0 + jnp.sqrt(1.0 - a * a) * noise


def v_target(x0: jax.Array, noise: jax.Array, a: jax.Array) -> jax.Array:
    """v = a noise - sqrt(1 - a^2) x0; shapes as in `add_noise`."""
    a = _bcast(a, x0)
    return a * noise - jnp.sqrt(1.0 - a * a) * x0


def x0_from_v(x_t: jax.Array, v: jax.Array, a: jax.Array) -> jax.Array:
    """D = a x_t - sqrt(1 - a^2) v (c_skip = a, c_out = -sqrt(1 - a^2))."""
    a = _bcast(a, x_t)
    return a * x_t - jnp.sqrt(1.0 - a * a) * v


def v_prediction_loss(v_pred: jax.Array, x0: jax.Array, noise: jax.Array, a: jax.Array) -> jax.Array:
    """Mean over all elements of `w (D - x0)^2`, w = 1/(1 - a^2), computed as MSE on v (float32 scalar)."""
    diff = v_pred.astype(jnp.float32) - v_target(x0.astype(jnp.float32), noise.astype(jnp.float32), a)
    return jnp.mean(jnp.square(diff))


def training_inputs(key: jax.Array, x0: jax.Array, schedule: DiffusionSchedule = DiffusionSchedule()
                    ) -> dict[str, jax.Array]:
    """Draws timesteps and noise for a batch of clean latents x0 [B, ...].

    Returns:
      dict with `x_t` (noisy latents, float32), `timesteps` (int32 [B], the network's input),
      `noise`, `a` (float32 [B]); feed `v_prediction_loss(model(x_t, ..., timesteps), x0, noise, a)`.
    """
    kt, kn = jax.random.split(key)
    t = sample_timesteps(kt, x0.shape[0], schedule.num_train_timesteps)
    a = a_of(t, schedule)
    # Drawn flat then reshaped: XLA:CPU compiles a 5-D `normal` slowly (same values).
    noise = jax.random.normal(kn, (x0.size,), jnp.float32).reshape(x0.shape)
    return {"x_t": add_noise(x0.astype(jnp.float32), noise, a), "timesteps": t, "noise": noise, "a": a}

