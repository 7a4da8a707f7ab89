"""The AnimeGamer training phases (paper §3.2, App. C.1; docs/training.md), plus
the 3D causal VAE's own autoencoder phase "vae" for configs without converted VAE weights.

Every phase trains one composite :class:`TrainModel` holding the components it needs; an NNX filter
picks the trained variables, so frozen components take no gradient and no optimizer memory:

| phase | components (frozen in brackets)              | trained                                      | loss |
|-------|----------------------------------------------|----------------------------------------------|------|
| a1    | shot_encoder, dit, [t5, clip, vae]           | E_a (all) + DiT ``flow_embed``               | v-MSE |
| a2    | shot_encoder, dit, [t5, clip, vae]           | E_a + DiT LoRA + ``flow_embed`` + block adaLN | v-MSE |
| b     | mllm, [shot_encoder, t5, clip]               | MLLM LoRA, RMSNorms, embeddings, lm_head, resamplers | CE + alpha MSE |
| c     | dit, [mllm, shot_encoder, t5, clip, vae]     | DiT LoRA + ``flow_embed`` + block adaLN      | v-MSE on MLLM reps |
| vae   | vae                                          | VAE (all)                                    | L1 + MSE + KL |

Phase "vae" is not in the paper (AnimeGamer starts from the released CogVideoX VAE): it trains the
VAE as a KL-regularized autoencoder (:func:`vae_loss`) under a clip-size curriculum
(``train.vae_curriculum``, :func:`vae_stage`) so that toy configs (configs/tiny.py) get a VAE whose
latents show their footage.

a1 follows the brief "E_a (+ motion embedding) against the frozen decoder" (the paper trains E_a
only; the release code also trains flow and LoRA, docs/training.md#trainable-sets). a2 and c use the DiT module's own
"joint" / "adaptation" sets (``models.cogvideox.dit.trainable_filter``), which include its LoRA factors.

Diffusion loss (docs/diffusion.md#training-loss): uniform integer timesteps, ``x_t = a x0 + sqrt(1-a^2) eps``, MSE on v (equal
to SAT's ``w (D - x0)^2`` with ``w = 1/(1-a^2)``), per-sample CFG dropout: T5 features -> zeros with
``diffusion.text_dropout`` and, independently, ``diffusion.text_ucg_rate``, CLIP features -> zeros with ``diffusion.image_dropout`` (so the learnt
uncond is E_a of zeros, docs/encoders.md#unconditional-embedding); in phase c the MLLM
representation is replaced by that uncond with ``diffusion.text_dropout``.

Phase b targets (docs/mllm.md#losses): the target turn's s_a = E_a(T5(action), CLIP(first frame)) from the frozen
(phase-a-trained) shot encoder; history slots carry the history turns' E_a representations
(teacher forcing; at play time they are the MLLM's own predictions).

Host batches (numpy, built by :class:`BatchBuilder` from the issue-7 loaders):
  decoder (a1, a2):  t5_ids int32 [B, Lt], first_frame f32 [B, H, W, 3] in [-1, 1], flow f32 [B],
                     and frames f32 [B, T, H, W, 3] in [-1, 1] (VAE-encoded in the step) or latents
                     f32 [B, T_lat, C, h, w] (already scaled; ``train.encode_latents=False``);
                     with ``train.precomputed_features`` f_md [B, Lt, Dt] / f_v [B, P, Dv] replace
                     t5_ids / first_frame (the frozen encoders then stay out of the step).
  mllm (b, c):       input_ids, cmp_mask, gen_mask, labels, padding_mask, turn_ids [B, L] (``mllm.collate``;
                     turn_ids feed the ``mllm.history_attention="turn_window"`` mask),
                     turn_t5_ids int32 [B, M, Lt], turn_first_frame f32 [B, M, H, W, 3],
                     target_turn int32 [B], history_turns int32 [B, W-1] (slot -> turn index)
                     (or precomputed turn_f_md [B, M, Lt, Dt] / turn_f_v [B, M, P, Dv], from the turns
                     loader's per-turn f_md / f_v: a dataset's feature fields named f_md / f_v serve
                     a1/a2 and b/c alike; fields named turn_f_md / turn_f_v serve b/c only);
                     phase c adds flow [B] and frames / latents of the target turn.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx

from animegamer_jax import paths
from animegamer_jax.diffusion import guidance, losses, schedules

PHASES: tuple[str, ...] = ("vae", "a1", "a2", "b", "c")

#: components held by each phase's TrainModel (frozen or not), in build order
PHASE_COMPONENTS: dict[str, tuple[str, ...]] = {
    "a1": ("shot_encoder", "dit", "t5", "clip"),
    "a2": ("shot_encoder", "dit", "t5", "clip"),
    "b": ("mllm", "shot_encoder", "t5", "clip"),
    "c": ("mllm", "shot_encoder", "dit", "t5", "clip"),
    "vae": ("vae",),
}

#: components whose weights each phase changes (written to the system checkpoint after it)
PHASE_OUTPUTS: dict[str, tuple[str, ...]] = {
    "a1": ("shot_encoder", "dit"), "a2": ("shot_encoder", "dit"), "b": ("mllm",), "c": ("dit",), "vae": ("vae",)}


def training_config(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """The config the train models are built from: fp32 master weights everywhere (activations keep
    the configured compute dtype), so the optimizer state is fp32 too; with ``train.remat`` every
    scanned block of the MLLM and DiT gets that remat policy (models/remat.py; "none" keeps the
    sections' own ``remat``; booleans of older configs: True = "full")."""
    from animegamer_jax.models import remat

    c = copy.deepcopy(config)
    policy = remat.policy_name(config.train.get("remat", "none"))
    with c.unlocked(), c.ignore_type():
        for section in ("mllm", "dit"):
            if "param_dtype" in c[section]:
                c[section].param_dtype = "float32"
            if policy != "none":
                c[section].remat = policy
    return c


def num_queries(config: ml_collections.ConfigDict) -> int:
    return int(config.rep.num_text_tokens + config.rep.num_image_tokens)


def build_component(name: str, config: ml_collections.ConfigDict, rngs: nnx.Rngs) -> nnx.Module:
    """One component from the full config (the same builders as the system checkpoint uses)."""
    from animegamer_jax import system_checkpoint

    return system_checkpoint.COMPONENT_BUILDERS[name](config, rngs)


class TrainModel(nnx.Module):
    """Container of the components a phase needs (attributes named as in the system checkpoint)."""

    def __init__(self, config: ml_collections.ConfigDict, components: tuple[str, ...], *, rngs: nnx.Rngs):
        self.component_names = tuple(components)
        for name in components:
            setattr(self, name, build_component(name, config, rngs))


def _under(prefix: str, inner: Any = None) -> Any:
    """Filter: variables under attribute ``prefix`` of the TrainModel (and matching ``inner``)."""

    def f(path: tuple[Any, ...], value: Any) -> bool:
        if not path or str(path[0]) != prefix:
            return False
        if inner is None:
            return isinstance(value, nnx.Param)
        return nnx.filterlib.to_predicate(inner)(path[1:], value)

    return f


def trainable_filter(phase: str, dit_trainable: str = "paper") -> Any:
    """NNX filter of the variables trained in ``phase`` (paths are relative to :class:`TrainModel`).

    ``dit_trainable`` (``config.train.dit_trainable``) picks the DiT set of phase a2: ``"paper"``
    trains the paper's / release's set (LoRA + ``flow_embed`` + block adaLN on top of the pretrained
    CogVideoX); ``"all"`` trains every DiT parameter, for toy configs that have no pretrained
    CogVideoX to adapt (configs/tiny.py: a random base under LoRA draws noise). Phases a1 and c keep
    their sets either way.

    Raises:
      ValueError: unknown phase or ``dit_trainable``.
    """
    if dit_trainable not in ("paper", "all"):
        raise ValueError(f"train.dit_trainable={dit_trainable!r}; use 'paper' or 'all'")
    from animegamer_jax.models.cogvideox import dit as cogvideox_dit
    from animegamer_jax.models.mistral import mllm

    if phase == "a1":
        flow = lambda path, v: isinstance(v, nnx.Param) and "flow_embed" in {str(p) for p in path}  # noqa: E731
        return nnx.Any(_under("shot_encoder"), _under("dit", flow))
    if phase == "a2":
        if dit_trainable == "all":
            return nnx.Any(_under("shot_encoder"), _under("dit"))
        return nnx.Any(_under("shot_encoder"), _under("dit", cogvideox_dit.trainable_filter("joint")))
    if phase == "b":
        return _under("mllm", mllm.trainable_filter)
    if phase == "c":
        return _under("dit", cogvideox_dit.trainable_filter("adaptation"))
    if phase == "vae":
        return _under("vae")
    raise ValueError(f"unknown training phase {phase!r}; use one of {PHASES}")


# ---------------------------------------------------------------------------------------------
# Losses (traced inside the jitted step).


def _encode_features(model: TrainModel, batch: Mapping[str, jax.Array], prefix: str = ""
                     ) -> tuple[jax.Array, jax.Array]:
    """Frozen T5 / CLIP features f_md [..., Lt, Dt] and f_v [..., P, Dv] of a batch.

    Uses precomputed ``{prefix}f_md`` / ``{prefix}f_v`` when the batch has them (data/extract_features),
    else runs the frozen encoders on ``{prefix}t5_ids`` [..., Lt] and ``{prefix}first_frame``
    [..., H, W, 3] (leading dims are flattened for the encoders and restored).
    """
    if prefix + "f_md" in batch:
        return batch[prefix + "f_md"], batch[prefix + "f_v"]
    ids, frames = batch[prefix + "t5_ids"], batch[prefix + "first_frame"]
    lead = ids.shape[:-1]
    f_md = model.t5(ids.reshape((-1, ids.shape[-1])))
    f_v = model.clip.visual.encode_reference(frames.reshape((-1,) + frames.shape[-3:]))
    f_md = f_md.reshape(lead + f_md.shape[1:])
    f_v = f_v.reshape(lead + f_v.shape[1:])
    return jax.lax.stop_gradient(f_md), jax.lax.stop_gradient(f_v)


def ea_representation(model: Any, batch: Mapping[str, jax.Array], prefix: str = "") -> jax.Array:
    """E_a's action-aware representation s_a [..., Q, rep_dim] (paper Sec. 3.2; the shot encoder's
    dtype, float32 at tiny size) of a batch's ``{prefix}t5_ids`` [..., Lt] + ``{prefix}first_frame``
    [..., H, W, 3] in [-1, 1] (or precomputed ``{prefix}f_md`` / ``{prefix}f_v``; leading dims, e.g.
    [B] or [B, M] turns, are kept): the frozen T5 / CLIP features through ``model.shot_encoder``.
    ``model`` is any module with ``shot_encoder`` (and ``t5`` / ``clip`` for raw batches)."""
    f_md, f_v = _encode_features(model, batch, prefix)
    lead = f_md.shape[:-2]
    reps = model.shot_encoder(f_md.reshape((-1,) + f_md.shape[-2:]), f_v.reshape((-1,) + f_v.shape[-2:]))
    return reps.reshape(lead + reps.shape[1:])


def _latents(model: TrainModel, batch: Mapping[str, jax.Array], config: ml_collections.ConfigDict,
             key: jax.Array) -> jax.Array:
    """Clean scaled latents x0 [B, T_lat, C, h, w]: given, or VAE-encoded from frames [B, T, H, W, 3]
    (frozen VAE; ``z = scaling_factor * sample(q(z|x))`` as SAT's ``encode_first_stage``, docs/diffusion.md#latent-scale)."""
    if "latents" in batch:
        return batch["latents"].astype(jnp.float32)
    if not hasattr(model, "vae"):
        raise ValueError("batch has no 'latents' and the train model has no VAE (train.encode_latents=False)")
    z = model.vae.encode(batch["frames"]).sample(key) * float(config.vae.scaling_factor)
    return jax.lax.stop_gradient(z.astype(jnp.float32))


def _diffusion_loss(model: TrainModel, cond: jax.Array, x0: jax.Array, flow: jax.Array, key: jax.Array,
                    schedule: schedules.DiffusionSchedule) -> jax.Array:
    ti = losses.training_inputs(key, x0, schedule)
    v = model.dit(ti["x_t"], cond, ti["timesteps"], flow)
    return losses.v_prediction_loss(v, x0, ti["noise"], ti["a"])


def decoder_loss(model: TrainModel, batch: Mapping[str, jax.Array], rng: jax.Array,
                 config: ml_collections.ConfigDict) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Phases a1 / a2: E_a(T5(action), CLIP(first frame)) conditions the DiT; v-prediction MSE."""
    k_t, k_i, k_n, k_z, k_u = jax.random.split(rng, 5)
    f_md, f_v = _encode_features(model, batch)
    f_md, drop_t = guidance.cfg_dropout(k_t, f_md, jnp.zeros_like(f_md[:1]), config.diffusion.text_dropout)
    # The release also zeroes T5 features per sample at the conditioner's ucg_rate, independently
    # (docs/diffusion.md#training-loss): about 1 - 0.95 * 0.9 = 14.5% of samples train the text-free branch.
    f_md, drop_u = guidance.cfg_dropout(k_u, f_md, jnp.zeros_like(f_md[:1]), config.diffusion.text_ucg_rate)
    drop_t = drop_t | drop_u
    f_v, drop_i = guidance.cfg_dropout(k_i, f_v, jnp.zeros_like(f_v[:1]), config.diffusion.image_dropout)
    cond = model.shot_encoder(f_md, f_v)
    x0 = _latents(model, batch, config, k_z)
    loss = _diffusion_loss(model, cond, x0, batch["flow"], k_n, schedules.DiffusionSchedule.from_config(config.diffusion))
    return loss, {"v_mse": loss, "text_dropped": jnp.mean(drop_t), "image_dropped": jnp.mean(drop_i)}


def _turn_reps(model: TrainModel, batch: Mapping[str, jax.Array]) -> jax.Array:
    """E_a representation of every turn: [B, M, Q, rep_dim] (frozen shot encoder)."""
    return jax.lax.stop_gradient(ea_representation(model, batch, "turn_"))


def _mllm_batch(model: TrainModel, batch: Mapping[str, jax.Array]) -> dict[str, jax.Array]:
    reps = _turn_reps(model, batch)
    take = lambda idx: jnp.take_along_axis(reps, idx.reshape(idx.shape + (1, 1)), axis=1)  # noqa: E731
    out = {k: batch[k] for k in ("input_ids", "gen_mask", "cmp_mask", "padding_mask", "labels", "turn_ids")
           if k in batch}
    out["target_reps"] = take(batch["target_turn"][:, None])[:, 0]
    out["history_reps"] = take(batch["history_turns"])
    return out


def mllm_loss(model: TrainModel, batch: Mapping[str, jax.Array], rng: jax.Array,
              config: ml_collections.ConfigDict) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Phase b: ``lm_loss_scale CE + rec_loss_scale MSE (+ cos)`` of the MLLM (docs/mllm.md#losses)."""
    total, parts = model.mllm.loss(_mllm_batch(model, batch), dropout_rng=rng)
    return total, {k: v for k, v in parts.items() if k != "loss"}


def adaptation_loss(model: TrainModel, batch: Mapping[str, jax.Array], rng: jax.Array,
                    config: ml_collections.ConfigDict) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Phase c: the frozen MLLM's predicted s_a (query read-out) conditions the DiT; v-prediction MSE."""
    k_d, k_n, k_z = jax.random.split(rng, 3)
    mb = _mllm_batch(model, batch)
    out = model.mllm(mb["input_ids"], gen_mask=mb["gen_mask"], cmp_mask=mb["cmp_mask"],
                     history_reps=mb["history_reps"], padding_mask=mb["padding_mask"], return_logits=False,
                     turn_ids=mb.get("turn_ids"))
    rep = jax.lax.stop_gradient(out.rep)
    uncond = jax.lax.stop_gradient(model.shot_encoder.uncond(1)).astype(rep.dtype)
    cond, dropped = guidance.cfg_dropout(k_d, rep, uncond, config.diffusion.text_dropout)
    x0 = _latents(model, batch, config, k_z)
    loss = _diffusion_loss(model, cond, x0, batch["flow"], k_n, schedules.DiffusionSchedule.from_config(config.diffusion))
    rep_mse = jnp.mean((rep.astype(jnp.float32) - mb["target_reps"].astype(jnp.float32)) ** 2)
    return loss, {"v_mse": loss, "cond_dropped": jnp.mean(dropped), "rep_mse_vs_ea": rep_mse}


def vae_decode_plan(num_latent_frames: int) -> tuple[int, ...]:
    """Decode chunk plan giving back ``1 + 4 (T_lat - 1)`` frames: the release plan (3, 2, 2, ...)
    (docs/vae.md#chunked-decoding), or one chunk for 1 or 3 latents.

    Raises:
      ValueError: ``T_lat == 2`` (2 latents decode to 8 or 2 frames, never 5: train on 1, 9 or 17 frames).
    """
    if num_latent_frames == 2:
        raise ValueError("2 latent frames (5 video frames) have no decode plan that returns 5 frames; "
                         "use clips of 1, 9 or 17 frames (train.vae_curriculum)")
    from animegamer_jax.models.cogvideox import vae as cogvideox_vae

    return cogvideox_vae.release_decode_plan(num_latent_frames)


def vae_loss(model: TrainModel, batch: Mapping[str, jax.Array], rng: jax.Array,
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


def latent_scaling_factor(vae: nnx.Module, batches: list[Mapping[str, np.ndarray]]) -> float:
    """``1 / std`` of the posterior means of ``batches`` (``frames`` [B, T, H, W, 3] in [-1, 1]): the
    latent scale that gives the DiT unit-variance latents, found as LDM / CogVideoX found theirs
    (the std of a batch of latents; CogVideoX's is 1.15258426, docs/diffusion.md#latent-scale)."""
    enc = nnx.jit(lambda m, x: m.encode(x).mean)
    means = [np.asarray(jax.device_get(enc(vae, jnp.asarray(b["frames"])))).ravel() for b in batches]
    std = float(np.std(np.concatenate(means)))
    if not np.isfinite(std) or std <= 0:
        raise ValueError(f"latent std is {std}; the VAE is broken (retrain it)")
    return 1.0 / std


LOSSES = {"a1": decoder_loss, "a2": decoder_loss, "b": mllm_loss, "c": adaptation_loss, "vae": vae_loss}


@dataclasses.dataclass
class PhaseSpec:
    """Everything :func:`animegamer_jax.train.loop.Trainer` needs for one phase."""

    phase: str
    components: tuple[str, ...]
    model_fn: Any
    loss_fn: Any
    trainable: Any
    outputs: tuple[str, ...]


def phase_spec(config: ml_collections.ConfigDict, phase: str | None = None, seed: int | None = None) -> PhaseSpec:
    """The model builder, loss and trainable filter of ``phase`` (default ``config.train.phase``).

    With ``config.train.encode_latents`` the VAE joins the decoder phases (frames are encoded in the
    step); otherwise batches must carry ``latents``. With ``config.train.precomputed_features`` T5 and
    CLIP stay out of the model and batches carry ``f_md`` / ``f_v`` (``turn_f_md`` / ``turn_f_v``).
    """
    phase = str(phase or config.train.phase)
    if phase not in PHASES:
        raise ValueError(f"unknown training phase {phase!r}; use one of {PHASES}")
    comps = PHASE_COMPONENTS[phase]
    if bool(config.train.precomputed_features):
        comps = tuple(c for c in comps if c not in ("t5", "clip"))
    if phase in ("a1", "a2", "c") and bool(config.train.encode_latents):
        comps = comps + ("vae",)
    tcfg = training_config(config)
    seed = int(config.seed if seed is None else seed)
    loss = LOSSES[phase]
    return PhaseSpec(
        phase=phase, components=comps,
        model_fn=lambda: TrainModel(tcfg, comps, rngs=nnx.Rngs(seed)),
        loss_fn=lambda model, batch, rng: loss(model, batch, rng, config),
        trainable=trainable_filter(phase, str(config.train.get("dit_trainable", "paper"))),
        outputs=PHASE_OUTPUTS[phase])


# ---------------------------------------------------------------------------------------------
# Host-side batch construction from the issue-7 loaders.


def flow_values(motion_level: np.ndarray, flow_table: Any) -> np.ndarray:
    """Motion level -> flow value on the host: play's rule (``models.cogvideox.dit.flow_value``,
    docs/dit.md#motion-level-to-flow) in numpy."""
    from animegamer_jax.models.cogvideox.dit import flow_value

    return flow_value(motion_level, tuple(flow_table), xp=np)


def _to_unit(frames: np.ndarray) -> np.ndarray:
    """uint8 [..., 3] -> float32 in [-1, 1]."""
    return np.asarray(frames, np.float32) / 127.5 - 1.0


def _strs(x: Any) -> list[str]:
    return [s.decode() if isinstance(s, bytes) else str(s) for s in np.asarray(x).reshape(-1)]


def vae_stage(curriculum: Any, step: int) -> tuple[int, int, int]:
    """(frames, height, width) of the "vae" phase's batches at ``step``.

    ``curriculum`` is ``((from_step, frames, height, width), ...)`` with increasing ``from_step``, the
    first 0 (``train.vae_curriculum``; e.g. single frames first, then short clips, then full size).

    Raises:
      ValueError: an empty curriculum, a first stage not at step 0, or non-increasing steps.
    """
    stages = [tuple(int(v) for v in s) for s in curriculum]
    if not stages or stages[0][0] != 0 or any(b[0] <= a[0] for a, b in zip(stages, stages[1:])):
        raise ValueError(f"train.vae_curriculum {curriculum!r} must be ((0, T, H, W), (step, T, H, W), ...) "
                         f"with increasing steps")
    cur = stages[0]
    for s in stages:
        if step >= s[0]:
            cur = s
    return cur[1], cur[2], cur[3]


def vae_windows(frames: np.ndarray, num_frames: int, height: int, width: int, rng: np.random.Generator,
                max_windows: int = 4, max_scale: float = 1.0) -> np.ndarray:
    """Random training windows of clips for the "vae" phase: uint8 [B, T, H, W, 3] ->
    [B * n, num_frames, height, width, 3], n = min(max_windows, T // num_frames) windows per clip, each
    at a random start frame and spatial crop, mirrored left-right with probability 1/2.

    ``max_scale`` > 1 makes the crops multi-scale (``train.vae_max_crop_scale``): each window's crop is
    ``s * (height, width)`` with ``s`` uniform in ``[1, min(max_scale, H / height, W / width)]``,
    area-resized to ``(height, width)`` (``data.video.resize_to``). On clips stored at twice the model
    size, ``s = 2`` is a whole frame as the model sees it and ``s = 1`` a quarter of it at full detail,
    so a few clips give many distinct images (the "random resized crop" of image autoencoders).
    ``max_scale = 1`` takes plain crops, bit for bit as before.

    Raises:
      ValueError: a window larger than the clips, or ``max_scale`` < 1.
    """
    from animegamer_jax.data import video

    b, t, h, w = frames.shape[:4]
    if num_frames > t or height > h or width > w:
        raise ValueError(f"vae window {num_frames}x{height}x{width} is larger than the clips {t}x{h}x{w}")
    if max_scale < 1.0:
        raise ValueError(f"train.vae_max_crop_scale={max_scale} must be >= 1")
    top = min(float(max_scale), h / height, w / width)
    n = max(1, min(int(max_windows), t // num_frames))
    out = []
    for i in range(b):
        for _ in range(n):
            s = 1.0 if top <= 1.0 else float(rng.uniform(1.0, top))
            ch, cw = min(h, int(round(height * s))), min(w, int(round(width * s)))
            t0, y0, x0 = (int(rng.integers(0, d + 1)) for d in (t - num_frames, h - ch, w - cw))
            win = frames[i, t0:t0 + num_frames, y0:y0 + ch, x0:x0 + cw]
            if (ch, cw) != (height, width):
                win = np.stack([video.resize_to(np.ascontiguousarray(f), width, height) for f in win])
            out.append(win[:, :, ::-1] if rng.random() < 0.5 else win)
    return np.ascontiguousarray(np.stack(out))


class BatchBuilder:
    """Turns loader batches (issue-7 ``make_loader`` "clips" / "turns" modes) into model-ready batches.

    Args:
      config: full config (tokenizer paths, lengths, flow table, ``train.vae_curriculum``).
      phase: "vae" / "a1" / "a2" (clips) or "b" / "c" (turns).

    ``__call__(ex, step)``: the step picks the "vae" curriculum stage and seeds its random windows
    (``fold(seed, step)``), so a resumed run builds the same batches as an uninterrupted one.
    """

    def __init__(self, config: ml_collections.ConfigDict, phase: str):
        from animegamer_jax import t5_tokenizer, tokenizer

        self.config, self.phase = config, phase
        if phase == "vae":
            vae_stage(config.train.vae_curriculum, 0)  # fail early on a malformed curriculum
            self.t5_tok = self.tok = None
            return
        spiece = paths.resource(config.t5.spiece_model)
        if not spiece or not paths.exists(spiece):
            raise FileNotFoundError(f"config.t5.spiece_model {spiece!r} not found (the T5 spiece.model shipped "
                                    f"with the T5 weights)")
        self.t5_tok = t5_tokenizer.T5Tokenizer(spiece, max_length=int(config.t5.max_length))
        self.tok = tokenizer.get_tokenizer() if phase in ("b", "c") else None

    def __call__(self, ex: Mapping[str, Any], step: int = 0) -> dict[str, np.ndarray]:
        if self.phase == "vae":
            return self.vae_batch(ex, step)
        if self.phase in ("a1", "a2"):
            return self.decoder_batch(ex)
        return self.mllm_batch(ex)

    def vae_batch(self, ex: Mapping[str, Any], step: int) -> dict[str, np.ndarray]:
        t, h, w = vae_stage(self.config.train.vae_curriculum, step)
        rng = np.random.default_rng([int(self.config.seed), int(step)])
        return {"frames": _to_unit(vae_windows(np.asarray(ex["frames"]), t, h, w, rng,
                                               int(self.config.train.vae_windows_per_clip),
                                               float(self.config.train.get("vae_max_crop_scale", 1.0))))}

    def decoder_batch(self, ex: Mapping[str, Any]) -> dict[str, np.ndarray]:
        out = {"flow": flow_values(ex["motion_level"], self.config.dit.flow_table)}
        if "f_md" in ex:  # precomputed T5 / CLIP features
            out["f_md"], out["f_v"] = np.asarray(ex["f_md"], np.float32), np.asarray(ex["f_v"], np.float32)
        else:
            out["t5_ids"] = self.t5_tok(_strs(ex["action"]))
            out["first_frame"] = _to_unit(ex["first_frame"])
        if "latents" in ex:
            out["latents"] = np.asarray(ex["latents"], np.float32)
        else:
            out["frames"] = _to_unit(ex["frames"])
        return out

    def mllm_batch(self, ex: Mapping[str, Any]) -> dict[str, np.ndarray]:
        from animegamer_jax.models.mistral import mllm

        cfg = self.config
        w = int(cfg.mllm.history_window)
        q = num_queries(cfg)
        num_turns = np.asarray(ex["num_turns"]).astype(np.int64)
        b, m = np.asarray(ex["states"]).shape[:2]
        instr = np.asarray(ex["instruction"]).reshape(b, m)
        seqs, target, hist = [], np.zeros(b, np.int32), np.zeros((b, max(w - 1, 1)), np.int32)
        for i in range(b):
            n = int(num_turns[i])
            states = np.asarray(ex["states"][i])
            seqs.append(mllm.build_sequence(self.tok, _strs(instr[i, :n]), [list(s) for s in states[:n - 1]],
                                            num_queries=q, history_window=w, target_states=list(states[n - 1])))
            target[i] = n - 1
            first = max(0, n - 1 - (w - 1))
            idx = list(range(first, n - 1))
            hist[i, :len(idx)] = idx
        out = mllm.collate(seqs, pad_to=int(cfg.train.max_seq_len))
        # Precomputed T5 / CLIP features per turn: the turns loader returns a dataset's per-clip feature
        # fields under their own names (f_md / f_v, the ones a1/a2 read in clips mode), [B, M, ...]
        feat = next((p for p in ("turn_", "") if p + "f_md" in ex or p + "f_v" in ex), None)
        if feat is not None:
            if feat + "f_md" not in ex or feat + "f_v" not in ex:
                have, lack = (feat + "f_md", feat + "f_v") if feat + "f_md" in ex else (feat + "f_v", feat + "f_md")
                raise KeyError(f"a turns example with stored feature {have!r} but not {lack!r}: a dataset stores "
                               f"both T5 (f_md) and CLIP (f_v) features or neither (data/prepare.py feature_fn)")
            out["turn_f_md"] = np.asarray(ex[feat + "f_md"], np.float32)
            out["turn_f_v"] = np.asarray(ex[feat + "f_v"], np.float32)
        else:
            # E_a's T5 input is the action text in every phase (a1/a2 train it on it); the whole
            # instruction would make targets that the decoder never saw
            if "action" not in ex:
                raise KeyError("a turns example without 'action' (each turn's action text, E_a's T5 input): "
                               "build it with data.loader's turns mode (SampleTurns), which carries it")
            actions = np.asarray(ex["action"]).reshape(b, m)
            out["turn_t5_ids"] = self.t5_tok([s for row in actions for s in _strs(row)]).reshape(b, m, -1)
            out["turn_first_frame"] = _to_unit(ex["first_frame"])
        out["target_turn"], out["history_turns"] = target, hist
        if self.phase == "c":
            levels = np.asarray(ex["motion_level"]) if "motion_level" in ex else np.asarray(ex["states"])[..., 0]
            levels = levels.reshape(b, m)
            out["flow"] = flow_values(levels[np.arange(b), target], cfg.dit.flow_table)
            if "latents" in ex:
                out["latents"] = np.asarray(ex["latents"], np.float32)[np.arange(b), target]
            else:
                out["frames"] = _to_unit(np.asarray(ex["frames"])[np.arange(b), target])
        return out


# ---------------------------------------------------------------------------------------------
# Periodic sample videos (decoder phases): what the DiT currently makes of the batch's first clip.


def sample_video(model: TrainModel, batch: Mapping[str, jax.Array], key: jax.Array,
                 config: ml_collections.ConfigDict) -> jax.Array:
    """One clip [1, T, H, W, 3] in [-1, 1] for the first example of a decoder-phase batch.

    s_a comes from E_a (a1/a2) or the MLLM (c); CFG uses the bias-only uncond (docs/encoders.md#unconditional-embedding) with the
    configured sampler and DynamicCFG; latents are decoded by the frozen VAE (÷ scaling factor).
    """
    from animegamer_jax.diffusion import samplers

    first = jax.tree.map(lambda x: x[:1], dict(batch))
    if "input_ids" in first:
        mb = _mllm_batch(model, first)
        cond = model.mllm(mb["input_ids"], gen_mask=mb["gen_mask"], cmp_mask=mb["cmp_mask"],
                          history_reps=mb["history_reps"], padding_mask=mb["padding_mask"], return_logits=False,
                          turn_ids=mb.get("turn_ids")).rep
    else:
        cond = ea_representation(model, first)
    uncond = model.shot_encoder.uncond(1).astype(cond.dtype)
    flow = first["flow"]
    d = config.dit
    shape = (1, int(d.num_latent_frames), int(d.in_channels), int(d.sample_height), int(d.sample_width))
    k_x, k_s = jax.random.split(key)
    plan = samplers.plan_from_config(config.diffusion)

    def denoise(x, t, c):
        return model.dit(x, c, t, jnp.broadcast_to(flow, (x.shape[0],)))

    z = samplers.sample(denoise, jax.random.normal(k_x, shape, jnp.float32), cond, uncond, k_s, plan)
    return model.vae.decode(z / float(config.vae.scaling_factor))


def sample_hook(trainer: Any, config: ml_collections.ConfigDict, workdir: str, every: int) -> Any:
    """``fit`` hook writing ``WORKDIR/samples/step_<n>.mp4`` every ``every`` steps (process 0)."""
    from animegamer_jax import video_io

    jitted = {}

    def hook(step: int, state: nnx.State, batch: Mapping[str, jax.Array]) -> None:
        if every <= 0 or step % every:
            return
        if "fn" not in jitted:
            jitted["fn"] = jax.jit(lambda st, b, k: sample_video(trainer.split(st)[0], b, k, config))
        from animegamer_jax import parallel

        with parallel.sharding_context(trainer.mesh, trainer.rules):
            video = jitted["fn"](state, batch, jax.random.key(step))
        if jax.process_index() == 0:
            video_io.write_mp4(paths.join(workdir, "samples", f"step_{step:07d}.mp4"),
                               np.asarray(jax.device_get(video))[0], fps=float(config.game.fps))

    return hook
