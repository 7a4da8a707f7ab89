"""Samplers for v-prediction models: VP-SDE DPM++ 2M (release) and DDIM (diffusers), with CFG in one batch.

Model-agnostic: the network enters as

    denoise_fn(x, timesteps, cond_batch) -> v
      x:          float [B', ...]  noisy latents (B' = 2B with guidance: unconditional half first)
      timesteps:  int32 [B']       DDPM index tau (0..999) of this step, the same for all samples
      cond_batch: pytree, leaves [B', ...]  conditioning (e.g. {"cond": s_a, "flow": flow})
      returns v-prediction with x's shape (any float dtype; the sampler works in float32)

`sample` is traceable: call it inside `jax.jit` / `nnx.jit` with the model as a jit argument so the
weights are not baked in as constants; the step loop is one `lax.scan`, so it compiles once for all
steps. A `SamplerPlan` holds every per-step coefficient, computed in float64 numpy outside jit.

DPM++ 2M (docs/diffusion.md#sampler, SAT `VPSDEDPMPP2MSampler`), lambda(a) = log(a / sqrt(1 - a^2)),
h = lambda(a_{i+1}) - lambda(a_i):
  D_i = CFG(a~_i x - sqrt(1 - a~_i^2) v)  (a~: a_i snapped to the training table; network gets tau_i)
  x <- m1 x - m2 D' + sigma_n xi,  m1 = sqrt((1-a_{i+1}^2)/(1-a_i^2)) e^{-h},  m2 = expm1(-2h) a_{i+1},
  sigma_n = sqrt(1 - a_{i+1}^2) sqrt(1 - e^{-2h}),  D' = (1 + 1/(2r)) D_i - 1/(2r) D_{i-1} for i >= 1,
  r = (lambda_i - lambda_{i-1}) / h; the last step returns D_i.
At a_0 = 0 (zero terminal SNR) lambda_0 = -inf: the limits m1 = 0, m2 = -a_1, sigma_n = sqrt(1 - a_1^2)
at i = 0 and 1/(2r) = 0 at i = 1 are used, so no inf/NaN reaches the loop. The reference draws an extra
noise sample per step for a discarded first-order update; noise here is
`normal(fold_in(key, i), (x.size,)).reshape(x.shape)`, or, given noise (`sample(..., step_noise=...)`),
step i's slice of an externally supplied array (e.g. the release's
own draws reordered by `inference.release_decoding.release_step_noise`).

Student (``sampler="student"``, :func:`sample_student`; docs/training.md#phase-d-distillation): a
consistency model's multistep sampler on N of the teacher's grid timesteps tau_j (:func:`student_timesteps`),
training-table a_j = sqrt(alpha_bar(tau_j)), one network call per step, no CFG batch (the student
takes the guidance scale as an input):
  D_j = a_j x - sqrt(1 - a_j^2) v(x, tau_j);  x <- a_{j+1} D_j + sqrt(1 - a_{j+1}^2) xi_j;  the last step returns D_{N-1}.

DDIM (eta = 0, diffusers `CogVideoXDDIMScheduler.step`, v-prediction): training-table alpha_bar at tau_i
and at tau_i - T/n (1.0 below 0): x <- sqrt((1-ab')/(1-ab)) x + (sqrt(ab') - sqrt(ab) sqrt((1-ab')/(1-ab))) D.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from animegamer_jax.diffusion.guidance import dynamic_cfg_scales
from animegamer_jax.diffusion.schedules import DiffusionSchedule
from animegamer_jax.parallel import constrain

DenoiseFn = Callable[[jax.Array, jax.Array, Any], jax.Array]
#: the teacher's samplers (``make_plan``; CFG in one batch)
SAMPLERS = ("dpmpp_2m", "ddim")
#: ``diffusion.sampler`` of the distilled student (phase d; :func:`sample_student`) and its step counts
STUDENT = "student"
STUDENT_STEPS = (1, 2, 4, 8)
#: the teacher's grid the student is distilled on and samples from, when a config has no
#: ``diffusion.student_grid_steps`` (configs saved before phase d existed)
STUDENT_GRID_STEPS = 50


def student_grid_steps(diffusion: Any) -> int:
    """``diffusion.student_grid_steps`` of a config section, :data:`STUDENT_GRID_STEPS` when absent."""
    return int(diffusion.get("student_grid_steps", STUDENT_GRID_STEPS))


@dataclasses.dataclass(frozen=True)
class SamplerPlan:
    """Per-step constants of a sampling run (numpy float64 / int64, length n = num_steps).

    x_{next} = m1 x - m2 (w_cur D_i + w_prev D_{i-1}) + noise_std xi, with
    D_i = CFG_{cfg_scale}(c_skip x - c_out v(x, timesteps_i)).
    """

    method: str
    timesteps: np.ndarray
    c_skip: np.ndarray
    c_out: np.ndarray
    m1: np.ndarray
    m2: np.ndarray
    noise_std: np.ndarray
    w_cur: np.ndarray
    w_prev: np.ndarray
    cfg_scale: np.ndarray

    @property
    def num_steps(self) -> int:
        return int(self.timesteps.shape[0])


def _lam(a: float) -> float:
    return float(np.log(a) - 0.5 * np.log1p(-a * a))


def make_plan(num_steps: int = 50, method: str = "dpmpp_2m",
              schedule: DiffusionSchedule = DiffusionSchedule(), cfg_scale: float = 6.0, cfg_exp: float = 5.0,
              cfg_schedule: str = "intended") -> SamplerPlan:
    """Builds the step coefficients for `method` ("dpmpp_2m" or "ddim") and a DynamicCFG schedule.

    Raises:
      ValueError: unknown method / CFG schedule, or a sampler sequence that is not increasing.
    """
    tau = schedule.sampling_timesteps(num_steps)
    n = num_steps
    m1, m2, sig = np.zeros(n), np.zeros(n), np.zeros(n)
    w_cur, w_prev = np.ones(n), np.zeros(n)
    if method == "dpmpp_2m":
        a = schedule.sampler_a(num_steps)
        if np.any(np.diff(a) <= 0) or a[0] < 0:
            raise ValueError("sampler a-sequence must increase from >= 0 to 1")
        a_snap = schedule.snap_to_train(a[:-1])
        c_skip, c_out = a_snap, np.sqrt(1.0 - a_snap ** 2)
        for i in range(n - 1):
            a0, a1 = a[i], a[i + 1]
            if a0 == 0.0:  # lambda = -inf, h = +inf: take the limits
                m1[i], m2[i], sig[i] = 0.0, -a1, np.sqrt(1.0 - a1 * a1)
            else:
                h = _lam(a1) - _lam(a0)
                m1[i] = np.sqrt((1.0 - a1 * a1) / (1.0 - a0 * a0)) * np.exp(-h)
                m2[i] = np.expm1(-2.0 * h) * a1
                sig[i] = np.sqrt(1.0 - a1 * a1) * np.sqrt(-np.expm1(-2.0 * h))
                if i >= 1:
                    inv2r = 0.0 if a[i - 1] == 0.0 else h / (2.0 * (_lam(a0) - _lam(a[i - 1])))
                    w_cur[i], w_prev[i] = 1.0 + inv2r, -inv2r
        # Last step returns D_i: x = 0 x - (-1) D.
        m1[n - 1], m2[n - 1], sig[n - 1] = 0.0, -1.0, 0.0
    elif method == "ddim":
        abar = schedule.alphas_cumprod()
        step = schedule.num_train_timesteps // n
        ab = abar[tau]
        ab_prev = np.where(tau - step >= 0, abar[np.maximum(tau - step, 0)], 1.0)
        c_skip, c_out = np.sqrt(ab), np.sqrt(1.0 - ab)
        m1 = np.sqrt((1.0 - ab_prev) / (1.0 - ab))
        m2 = -(np.sqrt(ab_prev) - np.sqrt(ab) * m1)
    else:
        raise ValueError(f"unknown sampler {method!r}; use one of {SAMPLERS}")
    scales = dynamic_cfg_scales(n, tau, cfg_scale, cfg_exp, cfg_schedule)
    return SamplerPlan(method, tau, c_skip, c_out, m1, m2, sig, w_cur, w_prev, scales)


def plan_from_config(diffusion: Any, num_steps: int | None = None, cfg_schedule: str | None = None) -> SamplerPlan:
    """`make_plan` from the `diffusion` config section (sampler, steps, cfg_scale/exp/schedule)."""
    return make_plan(num_steps or diffusion.num_sampling_steps, diffusion.sampler,
                     DiffusionSchedule.from_config(diffusion), diffusion.cfg_scale, diffusion.cfg_exp,
                     cfg_schedule or diffusion.cfg_schedule)


def sample(denoise_fn: DenoiseFn, latents: jax.Array, cond: Any, uncond: Any | None, key: jax.Array | None,
           plan: SamplerPlan, return_trajectory: bool = False,
           step_noise: jax.Array | None = None) -> jax.Array | tuple[jax.Array, jax.Array]:
    """Runs the sampling loop (one `lax.scan` over the steps).

    Args:
      denoise_fn: `(x, timesteps, cond_batch) -> v` (module docstring).
      latents: [B, ...] initial noise (standard normal, unscaled; docs/diffusion.md#sampler).
      cond: conditioning pytree, leaves [B, ...].
      uncond: unconditional pytree like `cond` (leaves [B, ...]); None disables guidance (batch B).
        With guidance the network sees one batch `concat([uncond, cond])` of 2B, constrained to
        `act_batch` so the halves can be split over a data mesh axis.
      key: PRNG key for the SDE noise (step i uses `fold_in(key, i)`, drawn flat; DDIM adds none);
        unused (may be None) when `step_noise` is given.
      plan: `make_plan(...)`.
      return_trajectory: also return x after every step ([n, B, ...]).
      step_noise: given noise, float [n, B, ...] (latents' shape per step): step i adds
        `plan.noise_std[i] * step_noise[i]` instead of drawing. With `latents` as the given initial
        noise this makes a run fully determined by external draws (release parity, docs/diffusion.md#sampler).

    Raises:
      ValueError: `step_noise` whose shape is not [plan.num_steps, *latents.shape], or neither
        `key` nor `step_noise`.

    Returns:
      Denoised latents x_0 [B, ...] float32 (and the trajectory).
    """
    b = latents.shape[0]
    if step_noise is not None and tuple(step_noise.shape) != (plan.num_steps, *latents.shape):
        raise ValueError(f"step_noise has shape {tuple(step_noise.shape)}, expected "
                         f"{(plan.num_steps, *latents.shape)} (steps, *latents.shape)")
    if step_noise is None and key is None:
        raise ValueError("sample needs a PRNG key or step_noise")
    guided = uncond is not None
    if guided:
        cond_batch = jax.tree.map(lambda u, c: jnp.concatenate([u, c], axis=0), uncond, cond)
        cond_batch = jax.tree.map(lambda c: constrain(c, ("act_batch",) + (None,) * (c.ndim - 1)), cond_batch)
    else:
        cond_batch = cond
    f32 = lambda v: jnp.asarray(v, jnp.float32)  # noqa: E731
    xs = {"t": jnp.asarray(plan.timesteps, jnp.int32), "c_skip": f32(plan.c_skip), "c_out": f32(plan.c_out),
          "m1": f32(plan.m1), "m2": f32(plan.m2), "sig": f32(plan.noise_std), "w_cur": f32(plan.w_cur),
          "w_prev": f32(plan.w_prev), "s": f32(plan.cfg_scale), "i": jnp.arange(plan.num_steps)}
    if step_noise is not None:
        xs["xi"] = step_noise.astype(jnp.float32)
    spec = lambda x: constrain(x, ("act_batch",) + (None,) * (x.ndim - 1))  # noqa: E731

    def step(carry, c):
        x, d_prev = carry
        xin = spec(jnp.concatenate([x, x], axis=0) if guided else x)
        t = jnp.full((xin.shape[0],), c["t"], jnp.int32)
        v = spec(denoise_fn(xin, t, cond_batch).astype(jnp.float32))
        d = c["c_skip"] * xin - c["c_out"] * v
        if guided:
            du, dc = d[:b], d[b:]
            d = du + c["s"] * (dc - du)
        dd = c["w_cur"] * d + c["w_prev"] * d_prev
        # Drawn flat then reshaped: XLA:CPU compiles a 5-D `normal` slowly (same values).
        if "xi" in c:
            xi = c["xi"]
        else:
            xi = jax.random.normal(jax.random.fold_in(key, c["i"]), (x.size,), jnp.float32).reshape(x.shape)
        x_new = c["m1"] * x - c["m2"] * dd + c["sig"] * xi
        return (x_new, d), (x_new if return_trajectory else None)

    x0 = latents.astype(jnp.float32)
    (x, _), traj = jax.lax.scan(step, (x0, jnp.zeros_like(x0)), xs)
    return (x, traj) if return_trajectory else x


def student_timesteps(num_steps: int, teacher_steps: int = 50,
                      schedule: DiffusionSchedule = DiffusionSchedule()) -> np.ndarray:
    """The student's timesteps (int64 [num_steps], highest noise first): every (teacher_steps /
    num_steps)-th point of the teacher's grid ``schedule.sampling_timesteps(teacher_steps)``, starting at
    its first (999): num_steps = 4 of 50 gives [999, 759, 499, 259].

    Raises:
      ValueError: ``num_steps`` not in 1..teacher_steps.
    """
    if not 1 <= num_steps <= teacher_steps:
        raise ValueError(f"student steps must be in 1..{teacher_steps} (the teacher's grid), got {num_steps}")
    grid = schedule.sampling_timesteps(teacher_steps)
    return grid[(np.arange(num_steps) * teacher_steps) // num_steps]


def sample_student(denoise_fn: DenoiseFn, latents: jax.Array, cond: Any, key: jax.Array | None,
                   timesteps: np.ndarray, schedule: DiffusionSchedule = DiffusionSchedule(),
                   step_noise: jax.Array | None = None) -> jax.Array:
    """The student's multistep consistency sampler (module docstring), one ``lax.scan`` over the steps.

    Args:
      denoise_fn: ``(x, timesteps, cond) -> v`` of the student (``cond`` carries its guidance scale).
      latents: [B, ...] initial noise (standard normal: at tau = 999 a = 0, x is all noise).
      cond: conditioning pytree, leaves [B, ...] (no unconditional batch).
      key: PRNG key of the re-noising draws (step j uses ``fold_in(key, j)``); unused with ``step_noise``.
      timesteps: int [num_steps] DDPM indices, highest noise first (:func:`student_timesteps`).
      schedule: the training table the a_j come from.
      step_noise: given noise float [num_steps, B, ...] (step j re-noises with ``step_noise[j]``; the last is unused).

    Raises:
      ValueError: ``step_noise`` of another shape than [num_steps, *latents.shape], or neither ``key`` nor it.

    Returns:
      float32 [B, ...]: the last step's x0 prediction.
    """
    tau = np.asarray(timesteps, np.int64)
    n = int(tau.shape[0])
    if step_noise is not None and tuple(step_noise.shape) != (n, *latents.shape):
        raise ValueError(f"step_noise has shape {tuple(step_noise.shape)}, expected {(n, *latents.shape)}")
    if step_noise is None and key is None:
        raise ValueError("sample_student needs a PRNG key or step_noise")
    table = schedule.train_a()
    a = table[tau]
    a_next = np.concatenate([a[1:], [1.0]])  # after the last step: x = D (no noise)
    f32 = lambda v: jnp.asarray(v, jnp.float32)  # noqa: E731
    xs = {"t": jnp.asarray(tau, jnp.int32), "a": f32(a), "s": f32(np.sqrt(1.0 - a * a)), "a1": f32(a_next),
          "s1": f32(np.sqrt(1.0 - a_next * a_next)), "i": jnp.arange(n)}
    if step_noise is not None:
        xs["xi"] = step_noise.astype(jnp.float32)
    spec = lambda x: constrain(x, ("act_batch",) + (None,) * (x.ndim - 1))  # noqa: E731

    def step(x, c):
        t = jnp.full((x.shape[0],), c["t"], jnp.int32)
        v = spec(denoise_fn(spec(x), t, cond).astype(jnp.float32))
        d = c["a"] * x - c["s"] * v
        if "xi" in c:
            xi = c["xi"]
        else:
            xi = jax.random.normal(jax.random.fold_in(key, c["i"]), (x.size,), jnp.float32).reshape(x.shape)
        return c["a1"] * d + c["s1"] * xi, None

    x, _ = jax.lax.scan(step, latents.astype(jnp.float32), xs)
    return x
