"""The real networks as a game system: GameStateMLLM -> CogVideoX DiT + DPM++ 2M (dynamic CFG) -> VAE.

Wraps loaded NNX modules (a system checkpoint's ``load_system``, game/loading.py) as a
:class:`~animegamer_jax.game.api.GameSystem` whose three functions take the modules' states as
jit arguments (weights are never baked in as constants). The stages are the inference layer's:
the MLLM turn (inference/mllm_turn.py ``mllm_turn``, or ``mllm_turn_cached`` on the game's KV
cache with ``mllm.history_attention = "turn_window"``), the clip sampler (inference/clip_sampler.py
``dit_sampler``) and the VAE decoder (inference/vae_decode.py ``vae_decoder``). In ``reference``
mode the MLLM returns the release's freely decoded ids and the system's ``parse_states`` is the
release's text parser (inference/release_decoding.py).
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
from flax import nnx

from animegamer_jax.io import media
from animegamer_jax.game.api import GameSystem
from animegamer_jax.inference import release_decoding
from animegamer_jax.inference.clip_sampler import dit_sampler
from animegamer_jax.inference.mllm_turn import STATE_TOKENS, mllm_prefill_cached, mllm_turn, mllm_turn_cached
from animegamer_jax.inference.mode import apply_mode
from animegamer_jax.inference.turn_inputs import CachePlan, TurnKVCache, WindowSpec
from animegamer_jax.inference.vae_decode import vae_decoder
from animegamer_jax.models.cogvideox import dit as dit_lib
from animegamer_jax.models.cogvideox.character import merge_character
from animegamer_jax.models.cogvideox.reference import encode_reference
from animegamer_jax.models.mistral import model as mistral
from animegamer_jax.models.mistral.mllm import quantize_weights


def cached_mllm_functions(g_mllm, llm_cfg: mistral.MistralConfig, config) -> dict[str, Any]:
    """The :class:`GameSystem` fields of the persistent-cache MLLM turn (``mllm_cached``,
    ``mllm_prefill``, ``init_cache``, ``cache_plan``) for the MLLM graphdef ``g_mllm`` whose state
    is ``params["mllm"]``; ``config`` with ``game.mode`` applied."""
    plan = CachePlan.from_spec(WindowSpec.from_config(config), STATE_TOKENS)
    readout = str(config.mllm.readout)

    def mllm_cached(p, cache, batch):
        states, rep, cache, _ = mllm_turn_cached(nnx.merge(g_mllm, p["mllm"]), cache, batch, plan, readout)
        return states, rep, cache

    def mllm_prefill(p, cache, batch):
        return mllm_prefill_cached(nnx.merge(g_mllm, p["mllm"]), cache, batch, plan, readout)[1]

    return {"mllm_cached": mllm_cached, "mllm_prefill": mllm_prefill, "cache_plan": plan,
            "init_cache": lambda batch: TurnKVCache.init(llm_cfg, batch, plan)}


def build_real_system(components: dict[str, Any], config, label: str, decode_fn=None) -> GameSystem:
    """Wraps loaded modules as a :class:`GameSystem`.

    Args:
      components: ``{"mllm": GameStateMLLM, "dit": CogVideoXDiT, "shot_encoder": ShotEncoder,
        "vae": VAE with ``decode(z)``}`` and optionally ``"reference"`` (phase r's adapter: the system
        gets ``encode_reference`` and its sampler takes ``reference=``) and ``"characters"`` (stored
        character LoRAs: the system gets ``character_names`` / ``apply_character``); ``"dit"`` is the module :func:`sampling_component` names
        (the student for ``diffusion.sampler="student"``).
      config: the run config with ``game.mode`` applied (:func:`~animegamer_jax.game.api.apply_mode`).
      label: shown in outputs.
      decode_fn: optional ``(latents [B, T, C, h, w]) -> frames [B, T, 8h, 8w, 3]`` in [0, 1]
        replacing the VAE (tests of the other stages); the label should say so.
    """
    config = apply_mode(config)
    window = int(config.mllm.history_window)
    reference_mode = config.game.mode == "reference"
    decoding = "free" if reference_mode else "constrained"
    max_new = int(config.game.get("reference_max_new_tokens", 200))
    # mllm.quantize (default "none"; reference mode: always "none"): weight-only int8 made here, at load
    g_mllm, s_mllm = nnx.split(quantize_weights(components["mllm"], config.mllm.get("quantize", "none")))
    # prepared once here, not per denoising step: LoRA merged, weights in the activation dtype
    g_dit, s_dit = nnx.split(dit_lib.prepare_for_inference(components["dit"]))
    uncond = components["shot_encoder"].uncond(1)[0].astype(jnp.float32)  # [Q, D] constant of E_a
    params = {"mllm": s_mllm, "dit": s_dit, "uncond": uncond}
    decode_plan, decode_chunk = (), None  # chunked decode for streaming (untiled VAE only)
    if decode_fn is None:
        g_vae, s_vae = nnx.split(components["vae"])
        params["vae"] = s_vae
        decode, decode_chunk, decode_plan = vae_decoder(g_vae, components["vae"].cfg, config)
    else:
        def decode(p, latents):
            return decode_fn(latents)

    def mllm(p, batch):
        return mllm_turn(nnx.merge(g_mllm, p["mllm"]), batch, window, decoding, max_new)

    cached = {}
    if config.mllm.get("history_attention", "window_recompute") == "turn_window":
        cached = cached_mllm_functions(g_mllm, components["mllm"].cfg.llm, config)

    g_ref, encode_ref = None, None
    if "reference" in components and decode_fn is None:  # phase r's adapter: --character works
        g_ref, params["reference"] = nnx.split(components["reference"])
        scale = float(config.vae.scaling_factor)

        def encode_ref(p, images):
            return encode_reference(nnx.merge(g_vae, p["vae"]), images, scale)

    names, apply_character = (), None
    if "characters" in components:  # character LoRAs (python -m animegamer_jax.commands.character fit)
        chars = components["characters"]
        names = tuple(chars.spec.names)
        g_chars, params["characters"] = nnx.split(chars)

        def apply_character(p, index):
            dit = nnx.merge(g_dit, p["dit"])
            merge_character(dit, nnx.merge(g_chars, p["characters"]).loras[index])
            return nnx.state(dit)
    preview = None
    if "preview" in components:  # phase preview's decoder: game.decoder=preview / preview_then_full
        g_prev, params["preview"] = nnx.split(components["preview"])

        def preview(p, latents):
            return media.to_unit(nnx.merge(g_prev, p["preview"])(latents), media.VAE_RANGE)

    sample = dit_sampler(g_dit, config, g_ref)
    parse = release_decoding.states_from_generated if decoding == "free" else None
    return GameSystem(params, mllm, sample, decode, label=label, decode_chunk=decode_chunk,
                      decode_plan=decode_plan, parse_states=parse, encode_reference=encode_ref, preview=preview,
                      character_names=names, apply_character=apply_character, **cached)
