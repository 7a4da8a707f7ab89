"""The clip sampler: s_a and the motion level -> a clip's latents (the CogVideoX DiT + DPM++ 2M, dynamic CFG).

(docs/dit.md#conditioning-paths, docs/dit.md#motion-level-to-flow, docs/diffusion.md#sampler,
docs/diffusion.md#guidance; diffusion/samplers.py.) ML -> flow value (``dit.flow_table``), cond =
s_a, uncond = E_a's unconditional embedding (shot_encoder.uncond,
docs/encoders.md#unconditional-embedding) with the same flow, one CFG batch per step. The sampler
is vmapped over games so each game's noise comes from its own key (``split(key)``: initial
latents, SDE noise), which makes a game's output independent of the batch it is played in. Given
noise replaces both draws: ``sample(..., noise={"initial": [B, t, C, h, w], "steps": [B, num_steps,
t, C, h, w]})`` (engine ``step(..., noise=...)``). In ``reference`` mode s_a is rounded to bfloat16 before
the DiT, as the release does. With ``diffusion.sampler = "student"`` the DiT is the distilled
student (checkpoint component ``student``, :func:`sampling_component`): ``num_sampling_steps``
calls, no CFG batch, the guidance scale ``diffusion.cfg_scale`` as its input
(samplers.sample_student). With a reference latent (``sample(..., reference=[B, 1, C, h, w])``, one
VAE latent frame per game, models/cogvideox/reference.py ``encode_reference``) and the system's
``reference`` adapter (``p["reference"]``), each game's DiT calls see its reference, in the CFG
batch's conditional and unconditional halves alike (docs/dit.md#reference-conditioning); with
``dit.reference_drops_image`` a game with a reference is conditioned on s_a's text tokens and E_a's
unconditional image tokens (``p["uncond"]``'s), as phase r trained it; without a reference the sampler
is the one it always was. Turn k of a game samples with the key :func:`turn_key` ``(game_seed, k)``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from animegamer_jax import parallel
from animegamer_jax.diffusion import samplers
from animegamer_jax.models.cogvideox.dit import flow_value


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return x ^ (x >> 31)


def turn_key(game_seed: int, turn: int) -> np.ndarray:
    """The raw uint32[2] PRNG key (threefry key data) of turn ``turn`` of a game.

    ``splitmix64(splitmix64(seed) ^ turn)`` split into two 32-bit words: computed on the host in
    pure Python because any eager ``jax.random`` call compiles threefry, which is slow on a CPU
    with ``jax_threefry_partitionable`` (this JAX's default).
    """
    x = _splitmix64(_splitmix64(int(game_seed) & 0xFFFFFFFFFFFFFFFF) ^ int(turn))
    return np.asarray([x >> 32, x & 0xFFFFFFFF], np.uint32)


def sampling_component(config) -> str:
    """The checkpoint component the clip sampler runs: ``"student"`` (phase d's distilled DiT) for
    ``diffusion.sampler = "student"``, else ``"dit"`` (the teacher)."""
    return "student" if str(config.diffusion.sampler) == samplers.STUDENT else "dit"


def dit_sampler(g_dit, config, g_reference=None):
    """The turn's DiT sampling as ``sample(p, rep [B, Q, rep_dim], ml int [B], keys [B, 2], noise=None,
    reference=None) -> latents [B, t, C, h, w]`` with ``p = {"dit": DiT state, "uncond": [Q, rep_dim]}``
    (plus ``"reference"``: the ``reference`` adapter's state, graph ``g_reference``, when a
    ``reference`` latent [B, 1, C, h, w] is given; the unconditional CFG half keeps it): per game,
    initial noise from its key (or the given ``noise`` = {"initial", "steps"} per game, see
    samplers.sample's ``step_noise``), then the configured sampler with CFG, or the student's
    (``diffusion.sampler="student"``: ``p["dit"]`` the student's state, ``noise["steps"]`` its num_steps
    re-noising draws, no CFG batch). In reference mode s_a
    is rounded to bfloat16 first, as the release does. The one clip sampler: play
    (turn_model.py ``RealTurnModel``), training's sample videos (train/samples.py), the decoder evaluation
    (eval/decoder.py) and the ahead-of-time programs (aot/pieces.py) all call it."""
    d = config.diffusion
    student = str(d.sampler) == samplers.STUDENT
    if student:  # the distilled student: N calls, no CFG batch, the guidance scale as its input
        schedule = samplers.DiffusionSchedule.from_config(d)
        tau = samplers.student_timesteps(int(d.num_sampling_steps), samplers.student_grid_steps(d), schedule)
        w = float(d.cfg_scale)
    else:
        plan = samplers.plan_from_config(d)
    table = tuple(config.dit.flow_table)
    reference_mode = config.game.mode == "reference"
    # with a reference: s_a's image tokens (after the text tokens) -> E_a's unconditional ones
    drop_image_at = int(config.rep.num_text_tokens) if bool(config.dit.get("reference_drops_image", False)) else None
    latent_shape = (config.dit.num_latent_frames, config.dit.in_channels, config.dit.sample_height,
                    config.dit.sample_width)

    def sample(p, rep, ml, keys, noise=None, reference=None):
        dit = nnx.merge(g_dit, p["dit"])
        if reference is not None and (g_reference is None or "reference" not in p):
            raise ValueError("a reference latent needs the reference adapter: dit_sampler(..., g_reference) and "
                             "p['reference'] (a system trained with phase r)")
        adapter = nnx.merge(g_reference, p["reference"]) if reference is not None else None
        flow = flow_value(ml, table)
        if reference_mode:  # the release casts s_a to bfloat16 before the DiT (inference_Decoder.py)
            rep = rep.astype(jnp.bfloat16).astype(jnp.float32)

        def denoise(x, t, c):
            if "reference" in c:
                return dit(x, c["cond"], t, c["flow"], c.get("guidance"), reference=c["reference"], adapter=adapter)
            return dit(x, c["cond"], t, c["flow"], c.get("guidance"))

        def one(rep_b, flow_b, key_b, noise_b, ref_b=None):
            k_init, k_sde = jax.random.split(key_b)
            if noise_b is None:
                x, steps = jax.random.normal(k_init, (1, *latent_shape), jnp.float32), None
            else:
                x, steps = noise_b["initial"][None], noise_b["steps"][:, None]
            if ref_b is not None and drop_image_at is not None:  # the look from the reference alone
                rep_b = jnp.concatenate([rep_b[:drop_image_at], p["uncond"][drop_image_at:].astype(rep_b.dtype)])
            cond = {"cond": rep_b[None], "flow": flow_b[None]}
            if ref_b is not None:
                cond["reference"] = ref_b[None]
            if student:
                cond["guidance"] = jnp.full((1,), w, jnp.float32)
                return samplers.sample_student(denoise, x, cond, k_sde, tau, schedule, step_noise=steps)[0]
            unc = {"cond": p["uncond"][None].astype(rep_b.dtype), "flow": flow_b[None]}
            if ref_b is not None:  # the unconditional half keeps the reference: CFG guides the action only
                unc["reference"] = ref_b[None]
            return samplers.sample(denoise, x, cond, unc, k_sde, plan, step_noise=steps)[0]

        # games stay split over the data axes inside the vmap (also in the attention's shard_map)
        if reference is None:
            return parallel.vmap_over_batch(one, rep.shape[0])(rep, flow, keys, noise)
        return parallel.vmap_over_batch(one, rep.shape[0])(rep, flow, keys, noise, reference.astype(jnp.float32))

    return sample
