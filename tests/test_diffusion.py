"""Diffusion schedules, samplers, guidance and losses vs diffusers and float64 numpy references."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from animegamer_jax.diffusion import guidance, losses, samplers
from animegamer_jax.diffusion.schedules import DiffusionSchedule

# docs/diffusion.md#guidance: the release DynamicCFG scales (exact float64 evaluation of the reference).
RELEASE_CFG_TABLE = [
    2.2915, 2.5435, 6.9744, 6.4204, 2.7881, 4.2719, 1.0376, 4.1704, 1.6180, 6.9831,
    1.0048, 2.8720, 6.9768, 1.6331, 4.3297, 2.4366, 6.3773, 6.0068, 3.4479, 3.1981,
    1.6548, 6.6100, 1.1947, 4.2953, 6.9854, 1.5213, 1.7616, 1.0579, 4.1275, 1.4823,
    2.0026, 5.9477, 4.1432, 6.5305, 6.1398, 6.9999, 6.1684, 1.1199, 2.0975, 6.6850,
    6.9992, 2.3432, 6.2128, 1.2505, 6.9996, 6.8644, 1.0636, 1.0000, 1.0000, 1.1234,
]


def _diffusers_scheduler():
    from diffusers import CogVideoXDDIMScheduler

    return CogVideoXDDIMScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
                                  snr_shift_scale=3.0, rescale_betas_zero_snr=True,
                                  prediction_type="v_prediction", timestep_spacing="trailing",
                                  set_alpha_to_one=True, clip_sample=False)


@pytest.mark.parity
def test_alphas_cumprod_match_diffusers():
    ours = DiffusionSchedule().alphas_cumprod()
    ref = _diffusers_scheduler().alphas_cumprod.double().numpy()
    np.testing.assert_allclose(ours, ref, rtol=1e-12, atol=1e-15)
    a = np.sqrt(ours)
    # docs/diffusion.md#schedule training-table values.
    np.testing.assert_allclose(a[[0, 250, 500, 750]], [0.998726, 0.62374, 0.30875, 0.10411], atol=1e-5)
    assert a[999] == 0.0


def test_sampler_sequence_and_snapping():
    sch = DiffusionSchedule()
    tau = sch.sampling_timesteps(50)
    assert tau[0] == 999 and tau[-1] == 19 and np.all(np.diff(tau) == -20)
    a = sch.sampler_a(50)
    assert a.shape == (51,) and a[0] == 0.0 and a[-1] == 1.0
    np.testing.assert_allclose(a[[1, 2, 48, 49]], [0.00522, 0.01092, 0.94562, 0.97394], atol=1e-5)
    # The denoiser snaps tau=39 and tau=19 to training indices 38 and 18 (docs/diffusion.md#schedule).
    table = sch.train_a()
    snapped = sch.snap_to_train(a[[48, 49]])
    np.testing.assert_array_equal(snapped, table[[38, 18]])
    assert abs(table[19] - 0.97292) < 1e-5


def test_release_cfg_table_reproduced():
    tau = DiffusionSchedule().sampling_timesteps(50)
    s = guidance.dynamic_cfg_scales(50, tau, 6.0, 5.0, "release")
    np.testing.assert_allclose(s, RELEASE_CFG_TABLE, atol=1e-4)
    intended = guidance.dynamic_cfg_scales(50, tau, 6.0, 5.0, "intended")
    assert intended[0] == 1.0 and np.all(np.diff(intended) >= 0)
    assert abs(intended[-1] - 6.8644) < 1e-3
    with pytest.raises(ValueError, match="unknown CFG schedule"):
        guidance.dynamic_cfg_scales(50, tau, schedule="smooth")


def _toy_v_np(x, t, cond):
    """A smooth t-dependent stand-in for the network (v-prediction), float64 numpy."""
    return np.tanh(0.7 * x + cond) * np.cos(t / 300.0)[:, None, None] + 0.05 * x


def _toy_v_jax(x, t, cond_batch):
    c = cond_batch["c"]
    return jnp.tanh(0.7 * x + c) * jnp.cos(t.astype(jnp.float32) / 300.0)[:, None, None] + 0.05 * x


def _toy_inputs(seed, b, uncond_scale):
    """(x_init, cond, uncond) float32 [b, 3, 4] drawn from ``seed``: uncond is ``uncond_scale`` x N(0, 1), zeros
    when 0 (then not drawn)."""
    rng = np.random.default_rng(seed)
    x_init = rng.standard_normal((b, 3, 4)).astype(np.float32)
    cond = rng.standard_normal((b, 3, 4)).astype(np.float32)
    if not uncond_scale:
        return x_init, cond, np.zeros_like(cond)
    return x_init, cond, (uncond_scale * rng.standard_normal((b, 3, 4))).astype(np.float32)


def _toy_sample(plan, x_init, cond, uncond, key):
    """(out, trajectory) of ``plan``'s jitted sampler on the toy velocity :func:`_toy_v_jax`."""
    return jax.jit(lambda x, c, u, k: samplers.sample(_toy_v_jax, x, {"c": c}, {"c": u}, k, plan,
                                                      return_trajectory=True))(x_init, cond, uncond, key)


@pytest.mark.parity
def test_ddim_matches_diffusers_step_by_step():
    import torch

    n, b = 10, 2
    x_init, cond, uncond = _toy_inputs(0, b, uncond_scale=0.0)
    plan = samplers.make_plan(n, "ddim", cfg_scale=6.0, cfg_exp=5.0, cfg_schedule="release")
    out, traj = _toy_sample(plan, x_init, cond, uncond, jax.random.key(0))

    sched = _diffusers_scheduler()
    sched.set_timesteps(n)
    np.testing.assert_array_equal(sched.timesteps.numpy(), plan.timesteps)
    x = torch.from_numpy(x_init).double()
    for i, t in enumerate(sched.timesteps):
        tt = np.full(b, float(t))
        vu = _toy_v_np(x.numpy(), tt, uncond)
        vc = _toy_v_np(x.numpy(), tt, cond)
        v = torch.from_numpy(vu + plan.cfg_scale[i] * (vc - vu))
        x = sched.step(v, int(t), x).prev_sample
        np.testing.assert_allclose(np.asarray(traj[i]), x.numpy(), atol=2e-5, err_msg=f"step {i}")
    np.testing.assert_allclose(np.asarray(out), x.numpy(), atol=2e-5)


def _dpmpp_reference(x, cond, uncond, scales, noises):
    """docs/diffusion.md#sampler in float64 numpy, infinities left to IEEE arithmetic."""
    T, s = 1000, 3.0
    betas = np.linspace(0.00085 ** 0.5, 0.012 ** 0.5, T) ** 2
    abar = np.cumprod(1 - betas)
    abar = abar / (s + (1 - s) * abar)
    full = np.sqrt(abar)
    table = (full - full[-1]) * full[0] / (full[0] - full[-1])
    n = len(scales)
    tau_up = np.linspace(T - 1, 0, n, endpoint=False).astype(int)[::-1]
    sub = np.sqrt(abar[tau_up])
    sub = (sub - sub[-1]) * sub[0] / (sub[0] - sub[-1])
    a = np.concatenate([sub[::-1], [1.0]])
    tau = tau_up[::-1]
    lam = lambda v: np.log(v / np.sqrt(1 - v * v))  # noqa: E731
    d_old = None
    with np.errstate(divide="ignore", invalid="ignore"):
        for i in range(n):
            a_snap = table[np.abs(table - a[i]).argmin()]
            tt = np.full(x.shape[0], float(tau[i]))
            du = a_snap * x - np.sqrt(1 - a_snap ** 2) * _toy_v_np(x, tt, uncond)
            dc = a_snap * x - np.sqrt(1 - a_snap ** 2) * _toy_v_np(x, tt, cond)
            d = du + scales[i] * (dc - du)
            if i == n - 1:
                return d
            h = lam(a[i + 1]) - lam(a[i])
            m1 = np.sqrt((1 - a[i + 1] ** 2) / (1 - a[i] ** 2)) * np.exp(-h)
            m2 = np.expm1(-2 * h) * a[i + 1]
            sig = np.sqrt(1 - a[i + 1] ** 2) * np.sqrt(1 - np.exp(-2 * h))
            if d_old is None:
                dd = d
            else:
                r = (lam(a[i]) - lam(a[i - 1])) / h
                dd = (1 + 1 / (2 * r)) * d - (1 / (2 * r)) * d_old
            x = m1 * x - m2 * dd + sig * noises[i]
            d_old = d


@pytest.mark.parity
def test_dpmpp_2m_matches_float64_reference():
    n, b = 12, 2
    x_init, cond, uncond = _toy_inputs(1, b, uncond_scale=0.1)
    plan = samplers.make_plan(n, "dpmpp_2m", cfg_scale=6.0, cfg_exp=5.0, cfg_schedule="intended")
    assert all(np.all(np.isfinite(getattr(plan, f))) for f in ("m1", "m2", "noise_std", "w_cur", "w_prev"))
    key = jax.random.key(3)
    out, traj = _toy_sample(plan, x_init, cond, uncond, key)
    assert np.all(np.isfinite(np.asarray(traj)))
    noises = [np.asarray(jax.random.normal(jax.random.fold_in(key, i), (x_init.size,)), np.float64).reshape(x_init.shape)
              for i in range(n)]
    ref = _dpmpp_reference(x_init.astype(np.float64), cond, uncond, plan.cfg_scale, noises)
    np.testing.assert_allclose(np.asarray(out), ref, atol=1e-4, rtol=1e-4)


def test_sampler_traces_denoise_once_and_runs_unguided():
    calls = []

    def fn(x, t, cb):
        calls.append(x.shape)
        return _toy_v_jax(x, t, cb)

    plan = samplers.make_plan(6, "dpmpp_2m")
    x = jnp.ones((1, 3, 4))
    out = jax.jit(lambda x: samplers.sample(fn, x, {"c": x}, {"c": 0 * x}, jax.random.key(0), plan))(x)
    assert calls == [(2, 3, 4)]  # one trace for all steps, cond/uncond halves in one batch
    out_u = samplers.sample(fn, x, {"c": x}, None, jax.random.key(0), plan)
    assert calls[-1] == (1, 3, 4)
    assert np.all(np.isfinite(np.asarray(out))) and np.all(np.isfinite(np.asarray(out_u)))
    with pytest.raises(ValueError, match="unknown sampler"):
        samplers.make_plan(6, "euler")
    from configs import animegamer_2b_7b

    full = samplers.plan_from_config(animegamer_2b_7b.get_config().diffusion)
    assert full.method == "dpmpp_2m" and full.num_steps == 50 and full.timesteps[0] == 999
    np.testing.assert_allclose(full.cfg_scale[[0, -1]], [1.0, 6.8644], atol=1e-4)


def test_v_loss_equals_weighted_x0_loss():
    rng = np.random.default_rng(2)
    x0 = jnp.asarray(rng.standard_normal((3, 2, 5)), jnp.float32)
    noise = jnp.asarray(rng.standard_normal((3, 2, 5)), jnp.float32)
    t = jnp.array([10, 500, 999])
    a = losses.a_of(t)
    v_pred = jnp.asarray(rng.standard_normal((3, 2, 5)), jnp.float32)
    x_t = losses.add_noise(x0, noise, a)
    d = losses.x0_from_v(x_t, v_pred, a)
    w = (1.0 / (1.0 - a * a))[:, None, None]
    ref = jnp.mean(w * (d - x0) ** 2)
    np.testing.assert_allclose(losses.v_prediction_loss(v_pred, x0, noise, a), ref, rtol=1e-4)
    v = losses.v_target(x0, noise, a)
    assert float(losses.v_prediction_loss(v, x0, noise, a)) < 1e-10
    np.testing.assert_allclose(losses.x0_from_v(x_t, v, a), x0, atol=1e-5)
    # tau = 999 is pure noise (a = 0).
    np.testing.assert_allclose(x_t[2], noise[2], atol=1e-7)


@pytest.mark.slow
def test_uniform_timesteps_and_cfg_dropout():
    t = np.asarray(losses.sample_timesteps(jax.random.key(0), 20000))
    assert t.min() == 0 and t.max() == 999 and abs(t.mean() - 499.5) < 10
    inp = losses.training_inputs(jax.random.key(1), jnp.zeros((4, 2, 3)))
    assert inp["x_t"].shape == (4, 2, 3) and inp["timesteps"].dtype == jnp.int32

    cond = {"s": jnp.ones((64, 3, 2)), "f": jnp.arange(64.0)}
    unc = {"s": jnp.full((1, 3, 2), -1.0), "f": jnp.zeros((1,))}
    out, drop = guidance.cfg_dropout(jax.random.key(2), cond, unc, 0.5)
    drop = np.asarray(drop)
    assert 0 < drop.sum() < 64
    np.testing.assert_array_equal(np.asarray(out["s"])[:, 0, 0], np.where(drop, -1.0, 1.0))
    np.testing.assert_array_equal(np.asarray(out["f"]), np.where(drop, 0.0, np.arange(64.0)))
    kept, none = guidance.cfg_dropout(jax.random.key(2), cond, unc, 0.0)
    assert not np.asarray(none).any() and np.array_equal(np.asarray(kept["s"]), np.asarray(cond["s"]))
