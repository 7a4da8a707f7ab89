"""The losses of the training phases (paper §3.2, App. C.1; docs/training.md), traced inside the jitted step.

Every loss is ``loss(model, batch, rng, config) -> (scalar, {metric: scalar})`` where ``model`` holds
the phase's components as attributes (``train.model.TrainModel``) and ``batch`` is what
a ``data.batches.BatchKind`` builds (its module docstring lists the keys and shapes).

| phase  | loss                                         |
|--------|----------------------------------------------|
| a1, a2 | :func:`decoder_loss`: v-MSE, DiT conditioned on E_a |
| b      | :func:`mllm_loss`: CE + alpha MSE            |
| c      | :func:`adaptation_loss`: v-MSE, DiT conditioned on the MLLM's s_a |
| d      | :func:`distill_loss`: consistency distillation of the guided DiT into the student |
| r      | :func:`reference_loss`: v-MSE, DiT conditioned on E_a and a reference image (adapter only) |
| vae    | :func:`vae_loss`: L1 + MSE + KL              |
| preview | :func:`preview_loss`: L1 + MSE of the preview decoder against the frozen VAE decoder |

Diffusion loss (docs/diffusion.md#training-loss): uniform integer timesteps, ``x_t = a x0 + sqrt(1-a^2) eps``,
MSE on v (equal to SAT's ``w (D - x0)^2`` with ``w = 1/(1-a^2)``), per-sample CFG dropout: T5 features
-> zeros with ``diffusion.text_dropout`` and, independently, ``diffusion.text_ucg_rate``, CLIP features
-> zeros with ``diffusion.image_dropout`` (so the learnt uncond is E_a of zeros,
docs/encoders.md#unconditional-embedding); in phase c the MLLM representation is replaced by that
uncond with ``diffusion.text_dropout``.

Phase b targets (docs/mllm.md#losses): the target turn's s_a = E_a(T5(action), CLIP(first frame)) from
the frozen (phase-a-trained) shot encoder; history slots carry the history turns' E_a representations
(teacher forcing; at play time they are the MLLM's own predictions).

Phase "vae" is not in the paper (AnimeGamer starts from the released CogVideoX VAE): it trains the
VAE as a KL-regularized autoencoder (:func:`vae_loss`) under a clip-size curriculum
(``train.vae_curriculum``, ``data.batches.vae_stage``) so that toy configs (configs/tiny.py) get a
VAE whose latents show their footage.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx

from animegamer_jax.diffusion import guidance, samplers, schedules
from animegamer_jax.diffusion import losses as diffusion_losses
from animegamer_jax.inference.action_representation import ea_representation, encode_features
from animegamer_jax.models.cogvideox import vae_tiling
from animegamer_jax.models.cogvideox.reference import encode_reference

#: ``(model, batch, rng, config) -> (loss [], {metric name: []})``
LossFn = Callable[[nnx.Module, Mapping[str, jax.Array], jax.Array, ml_collections.ConfigDict],
                  tuple[jax.Array, dict[str, jax.Array]]]


def _latents(model: nnx.Module, batch: Mapping[str, jax.Array], config: ml_collections.ConfigDict,
             key: jax.Array) -> jax.Array:
    """Clean scaled latents x0 [B, t, C, h, w]: given, or VAE-encoded from frames [B, T, 8h, 8w, 3]
    (frozen VAE; ``z = scaling_factor * sample(q(z|x))`` as SAT's ``encode_first_stage``,
    docs/diffusion.md#latent-scale).

    Raises:
      ValueError: no ``latents`` in the batch and no VAE in the model.
    """
    if "latents" in batch:
        return batch["latents"].astype(jnp.float32)
    if not hasattr(model, "vae"):
        raise ValueError("batch has no 'latents' and the train model has no VAE (train.encode_latents=False)")
    z = model.vae.encode(batch["frames"]).sample(key) * float(config.vae.scaling_factor)
    return jax.lax.stop_gradient(z.astype(jnp.float32))


def _diffusion_loss(model: nnx.Module, cond: jax.Array, x0: jax.Array, flow: jax.Array, key: jax.Array,
                    schedule: schedules.DiffusionSchedule, reference: jax.Array | None = None) -> jax.Array:
    """v-prediction MSE of ``model.dit`` at uniform random timesteps (docs/diffusion.md#training-loss);
    with ``reference`` [B, 1, C, h, w] the DiT also sees it through ``model.reference`` (phase r)."""
    inputs = diffusion_losses.training_inputs(key, x0, schedule)
    if reference is None:
        v = model.dit(inputs["x_t"], cond, inputs["timesteps"], flow)
    else:
        v = model.dit(inputs["x_t"], cond, inputs["timesteps"], flow, reference=reference, adapter=model.reference)
    return diffusion_losses.v_prediction_loss(v, x0, inputs["noise"], inputs["a"])


def decoder_loss(model: nnx.Module, batch: Mapping[str, jax.Array], rng: jax.Array,
                 config: ml_collections.ConfigDict) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Phases a1 / a2: E_a(T5(action), CLIP(first frame)) conditions the DiT; v-prediction MSE."""
    k_t, k_i, k_n, k_z, k_u = jax.random.split(rng, 5)
    cond, drop_t, drop_i = _ea_condition(model, batch, config, k_t, k_i, k_u)
    x0 = _latents(model, batch, config, k_z)
    schedule = schedules.DiffusionSchedule.from_config(config.diffusion)
    loss = _diffusion_loss(model, cond, x0, batch["flow"], k_n, schedule)
    return loss, {"v_mse": loss, "text_dropped": jnp.mean(drop_t), "image_dropped": jnp.mean(drop_i)}


def _ea_condition(model: nnx.Module, batch: Mapping[str, jax.Array], config: ml_collections.ConfigDict,
                  k_t: jax.Array, k_i: jax.Array, k_u: jax.Array,
                  image_dropout: float | None = None) -> tuple[jax.Array, jax.Array, jax.Array]:
    """E_a's s_a [B, Q, D] of a clips batch with the per-sample CFG dropouts of phases a1 / a2 (module
    docstring), and the text / image dropped masks [B]. ``image_dropout`` replaces
    ``diffusion.image_dropout`` as the rate at which f_v is zeroed (phase r's
    :func:`reference_image_dropout`)."""
    f_md, f_v = encode_features(model, batch)
    f_md, drop_t = guidance.cfg_dropout(k_t, f_md, jnp.zeros_like(f_md[:1]), config.diffusion.text_dropout)
    # The release also zeroes T5 features per sample at the conditioner's ucg_rate, independently
    # (docs/diffusion.md#training-loss): 1 - (1 - text_dropout) (1 - text_ucg_rate) of the samples
    # train the text-free branch.
    f_md, drop_u = guidance.cfg_dropout(k_u, f_md, jnp.zeros_like(f_md[:1]), config.diffusion.text_ucg_rate)
    drop_t = drop_t | drop_u
    rate = config.diffusion.image_dropout if image_dropout is None else image_dropout
    f_v, drop_i = guidance.cfg_dropout(k_i, f_v, jnp.zeros_like(f_v[:1]), rate)
    return model.shot_encoder(f_md, f_v), drop_t, drop_i


def reference_image_dropout(config: ml_collections.ConfigDict) -> float:
    """Phase r's rate of zeroing the clip's image features f_v (E_a's image tokens then the
    unconditional ones): 1.0 with ``dit.reference_drops_image`` (play conditions a referenced turn so,
    inference/clip_sampler.py), else ``train.reference_image_dropout`` when >= 0, else
    ``diffusion.image_dropout`` (phases a1 / a2's rate; configs without these keys too).

    Raises:
      ValueError: ``train.reference_image_dropout`` above 1.
    """
    if bool(config.dit.get("reference_drops_image", False)):
        return 1.0
    rate = float(config.train.get("reference_image_dropout", -1.0))
    if rate > 1.0:
        raise ValueError(f"config value train.reference_image_dropout={rate} is not a rate. Fix: a value in "
                         f"[0, 1], or -1 for diffusion.image_dropout")
    return float(config.diffusion.image_dropout) if rate < 0 else rate


def reference_loss(model: nnx.Module, batch: Mapping[str, jax.Array], rng: jax.Array,
                   config: ml_collections.ConfigDict) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Phase r (docs/training.md#phase-r-reference): phase a2's v-prediction MSE (E_a's s_a with the
    same CFG dropouts conditions the frozen DiT) with the clip's reference image joined as reference
    tokens (``model.reference``, the one trained component). The reference is ``reference_latent``
    [B, 1, C, h, w] when the batch carries it, else ``reference_frame`` uint8 [B, H, W, 3]
    VAE-encoded in the step (``encode_reference``: the posterior mean, as play encodes it). A
    CFG-dropped sample keeps its reference, as play's unconditional half does. The clip's image
    features are dropped at :func:`reference_image_dropout` (default: as in phase a2), so the
    adapter learns to take the look from the reference where s_a does not carry it."""
    k_t, k_i, k_n, k_z, k_u = jax.random.split(rng, 5)
    cond, drop_t, drop_i = _ea_condition(model, batch, config, k_t, k_i, k_u,
                                         image_dropout=reference_image_dropout(config))
    cond = jax.lax.stop_gradient(cond)
    x0 = _latents(model, batch, config, k_z)
    if "reference_latent" in batch:
        ref = batch["reference_latent"].astype(jnp.float32)
    else:
        if not hasattr(model, "vae"):
            raise ValueError("batch has no 'reference_latent' and the train model has no VAE to encode "
                             "'reference_frame'")
        ref = jax.lax.stop_gradient(encode_reference(model.vae, batch["reference_frame"],
                                                     float(config.vae.scaling_factor)))
    schedule = schedules.DiffusionSchedule.from_config(config.diffusion)
    loss = _diffusion_loss(model, cond, x0, batch["flow"], k_n, schedule, reference=ref)
    return loss, {"v_mse": loss, "text_dropped": jnp.mean(drop_t), "image_dropped": jnp.mean(drop_i)}


def _turn_reps(model: nnx.Module, batch: Mapping[str, jax.Array]) -> jax.Array:
    """E_a representation of every turn: [B, M, Q, rep_dim] (frozen shot encoder)."""
    return jax.lax.stop_gradient(ea_representation(model, batch, "turn_"))


def _mllm_batch(model: nnx.Module, batch: Mapping[str, jax.Array]) -> dict[str, jax.Array]:
    """The MLLM's inputs of a turns batch: its token arrays plus ``target_reps`` [B, Q, D] (the target
    turn's E_a representation) and ``history_reps`` [B, W-1, Q, D] (the history turns')."""
    reps = _turn_reps(model, batch)

    def take(idx: jax.Array) -> jax.Array:
        return jnp.take_along_axis(reps, idx.reshape(idx.shape + (1, 1)), axis=1)

    out = {k: batch[k] for k in ("input_ids", "gen_mask", "cmp_mask", "padding_mask", "labels", "turn_ids")
           if k in batch}
    out["target_reps"] = take(batch["target_turn"][:, None])[:, 0]
    out["history_reps"] = take(batch["history_turns"])
    return out


def mllm_representation(model: nnx.Module, mllm_batch: Mapping[str, jax.Array]) -> jax.Array:
    """The MLLM's predicted s_a [B, Q, D] (query read-out, no logits) for :func:`_mllm_batch`'s output."""
    return model.mllm(mllm_batch["input_ids"], gen_mask=mllm_batch["gen_mask"], cmp_mask=mllm_batch["cmp_mask"],
                      history_reps=mllm_batch["history_reps"], padding_mask=mllm_batch["padding_mask"],
                      return_logits=False, turn_ids=mllm_batch.get("turn_ids")).rep


def mllm_loss(model: nnx.Module, batch: Mapping[str, jax.Array], rng: jax.Array,
              config: ml_collections.ConfigDict) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Phase b: ``lm_loss_scale CE + rec_loss_scale MSE (+ cos)`` of the MLLM (docs/mllm.md#losses)."""
    total, parts = model.mllm.loss(_mllm_batch(model, batch), dropout_rng=rng)
    return total, {k: v for k, v in parts.items() if k != "loss"}


def adaptation_loss(model: nnx.Module, batch: Mapping[str, jax.Array], rng: jax.Array,
                    config: ml_collections.ConfigDict) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Phase c: the frozen MLLM's predicted s_a (query read-out) conditions the DiT; v-prediction MSE."""
    k_d, k_n, k_z = jax.random.split(rng, 3)
    mb = _mllm_batch(model, batch)
    rep = jax.lax.stop_gradient(mllm_representation(model, mb))
    uncond = jax.lax.stop_gradient(model.shot_encoder.uncond(1)).astype(rep.dtype)
    cond, dropped = guidance.cfg_dropout(k_d, rep, uncond, config.diffusion.text_dropout)
    x0 = _latents(model, batch, config, k_z)
    schedule = schedules.DiffusionSchedule.from_config(config.diffusion)
    loss = _diffusion_loss(model, cond, x0, batch["flow"], k_n, schedule)
    rep_mse = jnp.mean((rep.astype(jnp.float32) - mb["target_reps"].astype(jnp.float32)) ** 2)
    return loss, {"v_mse": loss, "cond_dropped": jnp.mean(dropped), "rep_mse_vs_ea": rep_mse}


def distill_loss(model: nnx.Module, batch: Mapping[str, jax.Array], rng: jax.Array,
                 config: ml_collections.ConfigDict) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Phase d: consistency distillation of the guided teacher ``model.dit`` (frozen) into
    ``model.student`` (docs/training.md#phase-d-distillation).

    Per sample: a DynamicCFG scale ``w ~ U(train.distill_cfg_scales)``, a point ``i`` of the teacher's
    grid tau_0 > ... > tau_{n-1} (``diffusion.student_grid_steps``, 50: play's timesteps) and
    ``x = a_i x0 + sqrt(1 - a_i^2) eps`` (training-table a). The teacher's guided x0-prediction
    ``D = D_u + s_i(w) (D_c - D_u)`` (one CFG batch, the config's ``cfg_exp`` / ``cfg_schedule``) takes
    one DDIM (probability-flow ODE) step to ``x'`` at tau_{i+1}; the target is the student's own
    prediction there (stop-gradient, no EMA: Song & Dhariwal 2023 found the EMA target unnecessary)
    or, at the grid's last point, the teacher's D itself, which is where play's teacher sampler ends.
    The loss is the MSE between the student's x0-prediction at (x, tau_i, w) and that target.
    Metrics: ``cd_mse``, ``teacher_gap`` (MSE of the student against the teacher's D at the same point)
    and ``cfg_scale`` (mean w).
    """
    k_t, k_w, k_n, k_z = jax.random.split(rng, 4)
    d, t = config.diffusion, config.train
    cond = jax.lax.stop_gradient(ea_representation(model, batch))
    uncond = jax.lax.stop_gradient(model.shot_encoder.uncond(1)).astype(cond.dtype)
    x0 = _latents(model, batch, config, k_z)
    b = x0.shape[0]
    schedule = schedules.DiffusionSchedule.from_config(d)
    n = samplers.student_grid_steps(d)
    grid = schedule.sampling_timesteps(n)
    a_grid = jnp.asarray(schedule.train_a()[grid], jnp.float32)
    lo, hi = (float(v) for v in t.distill_cfg_scales)
    w = jax.random.uniform(k_w, (b,), jnp.float32, lo, hi)
    scales = guidance.cfg_scales_of(w, n, grid, float(d.cfg_exp), str(d.cfg_schedule))
    i = jax.random.randint(k_t, (b,), 0, n)
    i1 = jnp.minimum(i + 1, n - 1)
    tau, tau1 = jnp.asarray(grid, jnp.int32)[i], jnp.asarray(grid, jnp.int32)[i1]
    a, a1 = a_grid[i], a_grid[i1]
    noise = jax.random.normal(k_n, (x0.size,), jnp.float32).reshape(x0.shape)
    x_t = diffusion_losses.add_noise(x0, noise, a)
    flow = batch["flow"]
    # the teacher, guided: one batch [uncond; cond] as play's sampler runs it
    v = model.dit(jnp.concatenate([x_t, x_t]), jnp.concatenate([jnp.broadcast_to(uncond, cond.shape), cond]),
                  jnp.concatenate([tau, tau]), jnp.concatenate([flow, flow])).astype(jnp.float32)
    d_u = diffusion_losses.x0_from_v(x_t, v[:b], a)
    d_c = diffusion_losses.x0_from_v(x_t, v[b:], a)
    s = jnp.take_along_axis(scales, i[:, None], axis=1)[:, 0]
    d_g = jax.lax.stop_gradient(d_u + s.reshape((b,) + (1,) * (x0.ndim - 1)) * (d_c - d_u))
    # one DDIM step of the guided probability-flow ODE to tau_{i+1}
    sig, sig1 = jnp.sqrt(1.0 - a * a), jnp.sqrt(1.0 - a1 * a1)
    bc = lambda z: z.reshape((b,) + (1,) * (x0.ndim - 1))  # noqa: E731
    eps = (x_t - bc(a) * d_g) / bc(sig)
    x_next = bc(a1) * d_g + bc(sig1) * eps
    v_next = model.student(x_next, cond, tau1, flow, w).astype(jnp.float32)
    target_next = jax.lax.stop_gradient(diffusion_losses.x0_from_v(x_next, v_next, a1))
    target = jnp.where(bc(i == n - 1), d_g, target_next)
    pred = diffusion_losses.x0_from_v(x_t, model.student(x_t, cond, tau, flow, w).astype(jnp.float32), a)
    loss = jnp.mean(jnp.square(pred - target))
    return loss, {"cd_mse": loss, "teacher_gap": jnp.mean(jnp.square(jax.lax.stop_gradient(pred) - d_g)),
                  "cfg_scale": jnp.mean(w)}


def vae_decode_plan(num_latent_frames: int) -> tuple[int, ...]:
    """Decode chunk plan giving back ``1 + 4 (t - 1)`` frames: the release plan (3, 2, 2, ...)
    (docs/vae.md#chunked-decoding), or one chunk for 1 or 3 latents.

    Raises:
      ValueError: ``t == 2`` (2 latents decode to 8 or 2 frames, never 5: train on 1, 9 or 17 frames).
    """
    if num_latent_frames == 2:
        raise ValueError("2 latent frames (5 video frames) have no decode plan that returns 5 frames; "
                         "use clips of 1, 9 or 17 frames (train.vae_curriculum)")
    return vae_tiling.release_decode_plan(num_latent_frames)


def vae_loss(model: nnx.Module, batch: Mapping[str, jax.Array], rng: jax.Array,
             config: ml_collections.ConfigDict) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Phase "vae": the 3D causal VAE as a KL-regularized autoencoder on ``frames`` [B, T, H, W, 3] in [-1, 1].

    ``L = mean|x - D(z)| + w_mse mean (x - D(z))^2 + w_kl sum KL(q(z|x) || N(0, I)) / (B H W T 3)``
    with ``z ~ q(z|x)`` (reparameterized) decoded by :func:`vae_decode_plan`. The L1 and KL terms and
    the KL weight's meaning (per-sample sums, as LDM's ``LPIPSWithDiscriminator`` and the CogVideoX
    SAT VAE loss, weight 1e-6) follow the CogVideoX recipe; its LPIPS and GAN terms need pretrained
    or extra networks and are left out; the MSE term (``train.vae_mse_weight``) pushes PSNR directly.
    Metrics: l1, mse, psnr (dB, frames mapped to [0, 1]), kl (per latent element), latent_std.
    """
    x = batch["frames"].astype(jnp.float32)
    post = model.vae.encode(x)
    z = post.sample(rng)
    recon = model.vae.decode(z, vae_decode_plan(z.shape[1])).astype(jnp.float32)
    err = recon - x
    l1 = jnp.mean(jnp.abs(err))
    mse = jnp.mean(err ** 2)
    mean, logvar = post.mean.astype(jnp.float32), post.logvar.astype(jnp.float32)
    kl_el = 0.5 * (mean ** 2 + jnp.exp(logvar) - 1.0 - logvar)
    kl_per_pixel = jnp.sum(kl_el) / x.size
    t = config.train
    loss = l1 + float(t.vae_mse_weight) * mse + float(t.vae_kl_weight) * kl_per_pixel
    psnr = 10.0 * jnp.log10(4.0 / jnp.maximum(mse, 1e-10))  # peak-to-peak 2 in [-1, 1] = 1 in [0, 1]
    return loss, {"l1": l1, "mse": mse, "psnr": psnr, "kl": jnp.mean(kl_el), "latent_std": jnp.std(mean)}


def preview_loss(model: nnx.Module, batch: Mapping[str, jax.Array], rng: jax.Array,
                 config: ml_collections.ConfigDict) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Phase "preview": distils the frozen VAE decoder into ``model.preview`` on the clips' latents.

    ``frames`` [B, T, H, W, 3] in [-1, 1] -> scaled latents ``z = scaling_factor * mean(q(z|x))`` (frozen
    encoder, posterior mean) -> target ``clip(VAE_dec(z / scaling_factor), -1, 1)`` (frozen decoder, the
    release chunk plan :func:`vae_decode_plan`, as play decodes untiled); with ``latents`` in the batch
    those are used instead of encoding. ``L = mean|p - y| + mean (p - y)^2 (+ w mean (p - x)^2)`` with
    ``p = preview(z)``, ``y`` the target, ``w = train.preview_real_weight`` (0: distillation only).
    Metrics: l1, mse, psnr (dB against the VAE decode, frames in [0, 1]), psnr_real (against the frames).
    """
    del rng
    x = batch["frames"].astype(jnp.float32)
    scale = float(config.vae.scaling_factor)
    z = batch["latents"].astype(jnp.float32) if "latents" in batch else model.vae.encode(x).mean * scale
    z = jax.lax.stop_gradient(z)
    target = jnp.clip(model.vae.decode(z / scale, vae_decode_plan(z.shape[1])).astype(jnp.float32), -1.0, 1.0)
    target = jax.lax.stop_gradient(target)
    pred = model.preview(z).astype(jnp.float32)
    err = pred - target
    l1, mse = jnp.mean(jnp.abs(err)), jnp.mean(err ** 2)
    mse_real = jnp.mean((pred - x) ** 2)
    loss = l1 + mse + float(config.train.get("preview_real_weight", 0.0)) * mse_real
    psnr = lambda m: 10.0 * jnp.log10(4.0 / jnp.maximum(m, 1e-10))  # noqa: E731  (peak-to-peak 2 = 1 in [0, 1])
    return loss, {"l1": l1, "mse": mse, "psnr": psnr(mse), "psnr_real": psnr(mse_real)}


def latent_scaling_factor(vae: nnx.Module, batches: list[Mapping[str, np.ndarray]]) -> float:
    """``1 / std`` of the posterior means of ``batches`` (``frames`` [B, T, H, W, 3] in [-1, 1]): the
    latent scale that gives the DiT unit-variance latents, found as LDM / CogVideoX found theirs
    (the std of a batch of latents; CogVideoX's is 1.15258426, docs/diffusion.md#latent-scale).

    Raises:
      ValueError: a std that is not finite and positive (a broken VAE).
    """
    enc = nnx.jit(lambda m, x: m.encode(x).mean)
    means = [np.asarray(jax.device_get(enc(vae, jnp.asarray(b["frames"])))).ravel() for b in batches]
    std = float(np.std(np.concatenate(means)))
    if not np.isfinite(std) or std <= 0:
        raise ValueError(f"latent std is {std}; the VAE is broken (retrain it)")
    return 1.0 / std

