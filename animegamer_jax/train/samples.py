"""Periodic sample videos of the decoder phases: what the DiT currently makes of the batch's first clip.

The clip is sampled from s_a by play's own DiT sampler (``inference.clip_sampler.dit_sampler``: the configured
sampler with DynamicCFG against the bias-only uncond, docs/encoders.md#unconditional-embedding) and
decoded by the frozen VAE.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx

from animegamer_jax import parallel

from animegamer_jax.io import paths

from animegamer_jax.io import media
from animegamer_jax.inference.action_representation import ea_representation
from animegamer_jax.inference.clip_sampler import dit_sampler
from animegamer_jax.train import losses


def motion_levels(flow: jax.Array, flow_table: Sequence[float]) -> jax.Array:
    """Motion levels int32 [B] whose flow value (``models.cogvideox.dit.flow_value``) is ``flow`` [B].

    ``flow`` holds values of ``flow_table`` (what ``BatchBuilder`` puts in a batch): the level of the
    nearest table entry maps back to exactly that value (the last entry through the out-of-range level).
    """
    table = jnp.asarray(tuple(flow_table), jnp.float32)
    nearest = jnp.argmin(jnp.abs(flow.astype(jnp.float32)[:, None] - table[None, :]), axis=-1)
    return (nearest + 1).astype(jnp.int32)


def sample_video(model: nnx.Module, batch: Mapping[str, jax.Array], key: jax.Array,
                 config: ml_collections.ConfigDict) -> jax.Array:
    """One clip float32 [1, T, H, W, 3] in [-1, 1] (not clipped) for the first example of a decoder-phase batch.

    s_a comes from E_a (a1/a2: ``t5_ids`` / ``first_frame`` or ``f_md`` / ``f_v``) or the MLLM (c: the
    turns batch); the batch's ``flow`` sets the motion. ``model`` holds ``shot_encoder``, ``dit`` and
    ``vae`` (and ``t5`` / ``clip`` or ``mllm`` for the batch's inputs). ``key`` gives the initial noise
    and the sampler's noise as it gives play's turn; latents are decoded by the VAE (÷ scaling factor).
    """
    first = jax.tree.map(lambda x: x[:1], dict(batch))
    if "input_ids" in first:
        cond = losses.mllm_representation(model, losses._mllm_batch(model, first))
    else:
        cond = ea_representation(model, first)
    uncond = model.shot_encoder.uncond(1).astype(cond.dtype)
    graphdef, state = nnx.split(model.dit)
    sample = dit_sampler(graphdef, config)
    levels = motion_levels(first["flow"], config.dit.flow_table)
    z = sample({"dit": state, "uncond": uncond[0]}, cond, levels, key[None])
    return model.vae.decode(z / float(config.vae.scaling_factor))


def sample_hook(trainer: Any, config: ml_collections.ConfigDict, workdir: str,
                every: int) -> Callable[[int, nnx.State, Mapping[str, jax.Array]], None]:
    """``fit`` hook writing ``WORKDIR/samples/step_<n>.mp4`` every ``every`` steps (process 0)."""
    jitted = {}

    def hook(step: int, state: nnx.State, batch: Mapping[str, jax.Array]) -> None:
        if every <= 0 or step % every:
            return
        if "fn" not in jitted:
            jitted["fn"] = jax.jit(lambda st, b, k: sample_video(trainer.split(st)[0], b, k, config))
        with parallel.sharding_context(trainer.mesh, trainer.rules):
            clip = jitted["fn"](state, batch, jax.random.key(step))
        if jax.process_index() == 0:
            media.write_mp4(paths.join(workdir, "samples", f"step_{step:07d}.mp4"),
                               np.asarray(jax.device_get(clip))[0], fps=float(config.game.fps))

    return hook
