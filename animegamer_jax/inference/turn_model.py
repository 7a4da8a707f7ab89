"""The turn model: what the game engine plays a turn with, and the real networks' one.

A :class:`TurnModel` (a ``Protocol``) is a typed object holding its parameters (and, for the real
networks, their graphdefs) with one method per stage of a turn (:data:`STAGES`): the MLLM pass
(:meth:`~TurnModel.mllm`), sampling (:meth:`~TurnModel.sample`) and the VAE decode
(:meth:`~TurnModel.decode`). Each takes the parameters as its first argument, so the engine (game/engine.py)
jits them with the weights as arguments, never as constants. What not every model can do is one of
five optional capabilities, ``None`` when absent:

* ``kv_cache`` (:class:`CachedMLLM`): the MLLM pass on the games' persistent KV cache
  (``mllm.history_attention = "turn_window"``);
* ``streaming`` (:class:`ChunkedDecode`): the decode one causal chunk at a time (the web server);
* ``reference`` (:class:`ReferenceEncoder`): a reference image's latent (training phase r, ``--character``);
* ``characters`` (:class:`CharacterBank`): stored character LoRAs folded into the DiT;
* ``preview`` (:class:`PreviewDecoder`): the small distilled decoder (``game.decoder`` preview modes).

:class:`RealTurnModel` is the real networks (GameStateMLLM -> CogVideoX DiT + DPM++ 2M with
dynamic CFG -> VAE) on loaded NNX modules; the stages are this layer's: the MLLM turn
(mllm_turn.py), the clip sampler (clip_sampler.py) and the VAE decoder (vae_decode.py). In
``reference`` mode its MLLM returns the release's freely decoded ids (``free_decoding``), read by
release_decoding.py's text parser. The random stand-in of the tests is standin_model.py's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import jax
import jax.numpy as jnp
from flax import nnx

from animegamer_jax.io import media
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

__all__ = ["STAGES", "CachedMLLM", "CharacterBank", "ChunkedDecode", "PreviewDecoder", "RealTurnModel",
           "ReferenceEncoder", "TurnModel", "check_capabilities"]

#: the three jitted stages of a turn, in order (timings and compile counts are keyed by these)
STAGES = ("mllm", "sampling", "vae")


class CachedMLLM:
    """The MLLM turn on the games' persistent KV cache (``mllm.history_attention = "turn_window"``):
    an inference/turn_inputs.py ``TurnKVCache`` laid out by :attr:`plan`, batches from its
    ``stack_cached_inputs``; the MLLM's state is ``params["mllm"]`` of graphdef ``graphdef``.

    Args:
      graphdef: the GameStateMLLM graphdef.
      llm_cfg: its Mistral config (the cache's shapes).
      config: the run config with ``game.mode`` applied.
    """

    def __init__(self, graphdef, llm_cfg: mistral.MistralConfig, config):
        self.graphdef, self.llm_cfg = graphdef, llm_cfg
        self.plan = CachePlan.from_spec(WindowSpec.from_config(config), STATE_TOKENS)
        self.readout = str(config.mllm.readout)

    def turn(self, params, cache: TurnKVCache, batch) -> tuple[jax.Array, jax.Array, TurnKVCache]:
        """``(states int32 [B, 4], rep float32 [B, Q, rep_dim], cache)``: the turn on ``cache``."""
        states, rep, cache, _ = mllm_turn_cached(nnx.merge(self.graphdef, params["mllm"]), cache, batch,
                                                 self.plan, self.readout)
        return states, rep, cache

    def prefill(self, params, cache: TurnKVCache, batch) -> TurnKVCache:
        """The same turn's shared prefill only (rebuilding a cache by recompute)."""
        return mllm_prefill_cached(nnx.merge(self.graphdef, params["mllm"]), cache, batch, self.plan,
                                   self.readout)[1]

    def init(self, batch: int) -> TurnKVCache:
        """An empty cache of ``batch`` games."""
        return TurnKVCache.init(self.llm_cfg, batch, self.plan)


@dataclasses.dataclass(frozen=True)
class ChunkedDecode:
    """The decode one causal chunk at a time, for showing frames as they are decoded (web server).

    Attributes:
      plan: the latent chunk sizes the chunks are run with (sum = t), the decode's own chunk plan,
        so the frames match :meth:`TurnModel.decode`'s.
      chunk: ``(params, latents_chunk [B, t_i, C, h, w], cache | None) -> (frames [B, f, H, W, 3],
        cache)``: one chunk, the causal cache carried from the one before.
    """

    plan: tuple[int, ...]
    chunk: Callable[[Any, jax.Array, Any], tuple[jax.Array, Any]]


@runtime_checkable
class ReferenceEncoder(Protocol):
    """A reference image's latent: ``(params, images uint8 [B, H, W, 3]) -> float32 [B, 1, C, h, w]``;
    :meth:`TurnModel.sample` then takes ``reference=`` those latents (game/characters.py)."""

    def __call__(self, params: Any, images: jax.Array) -> jax.Array: ...


@runtime_checkable
class PreviewDecoder(Protocol):
    """The small distilled decoder: ``(params, latents) -> frames`` like :meth:`TurnModel.decode`
    (same shape and range), played with ``game.decoder=preview`` or ``preview_then_full``."""

    def __call__(self, params: Any, latents: jax.Array) -> jax.Array: ...


class CharacterBank:
    """Stored character LoRAs (component ``characters``, ``python -m animegamer_jax.commands.character fit``).

    Args:
      names: the characters' names, in their stored order.
      dit_graphdef, characters_graphdef: the DiT's and the LoRAs' graphdefs (states
        ``params["dit"]``, ``params["characters"]``).
    """

    def __init__(self, names: tuple[str, ...], dit_graphdef, characters_graphdef):
        self.names = tuple(names)
        self.dit_graphdef, self.characters_graphdef = dit_graphdef, characters_graphdef

    def apply(self, params, index: int):
        """The DiT state with stored character ``index``'s LoRA folded into its attention (``index``
        static): :meth:`TurnModel.sample` with ``params["dit"]`` replaced by it plays a turn naming
        the character."""
        dit = nnx.merge(self.dit_graphdef, params["dit"])
        merge_character(dit, nnx.merge(self.characters_graphdef, params["characters"]).loras[index])
        return nnx.state(dit)


@runtime_checkable
class TurnModel(Protocol):
    """The three stages of a turn and their parameters: what :class:`GameEngine` (game/engine.py) plays.

    Attributes:
      params: pytree with the arrays each stage needs (``params["mllm"]``, ... or any layout the
        methods agree on); passed to every method as its first argument (a jit argument).
      label: what the model is (shown in outputs), e.g. ``"checkpoint /ckpt/system"``.
      identity: what the weights are, for output fingerprints (a checkpoint's content digest,
        ``checkpoint_identity``); empty = the label.
      description: what it was trained on and can show, from the checkpoint's manifest
        (``save_system(description=...)``); "" when it has none. Shown in game.json
        (``system_description``), the gallery, play's summary and the web app.
      free_decoding: :meth:`mllm` returns freely generated ids ``int [B, T]`` instead of states
        (``reference`` mode), which the release's text parser reads
        (inference/release_decoding.py ``states_from_generated``).
      kv_cache, streaming, reference, characters, preview: the optional capabilities (module
        docstring), None when absent.
    """

    params: Any
    label: str
    identity: str
    description: str
    free_decoding: bool
    kv_cache: CachedMLLM | None
    streaming: ChunkedDecode | None
    reference: ReferenceEncoder | None
    characters: CharacterBank | None
    preview: PreviewDecoder | None

    def mllm(self, params: Any, batch: dict) -> tuple[jax.Array, jax.Array]:
        """``(states int32 [B, 4], rep float32 [B, Q, rep_dim])``; ``batch`` is
        inference/turn_inputs.py ``stack_inputs`` output (ids, attention_mask, cmp_mask, gen_mask,
        hist_reps, hist_pos, hist_valid, read_idx, last_idx)."""
        ...

    def sample(self, params: Any, rep: jax.Array, ml: jax.Array, keys: jax.Array, noise: dict | None = None,
               reference: jax.Array | None = None) -> jax.Array:
        """``rep [B, Q, rep_dim], ml int32 [B], keys uint32 [B, 2] -> latents [B, t, C, h, w]``; row b
        uses only ``keys[b]`` for its noise, or, when ``noise`` is given, ``{"initial": [B, t, C, h, w],
        "steps": [B, num_steps, t, C, h, w]}``; ``reference``: per row a :attr:`reference` latent."""
        ...

    def decode(self, params: Any, latents: jax.Array) -> jax.Array:
        """``latents -> frames float32 [B, T, 8h, 8w, 3]`` in inference/vae_decode.py's ``FRAME_RANGE``."""
        ...


def check_capabilities(model: TurnModel, config) -> None:
    """Refuses a config that asks ``model`` for a capability it lacks (the one-line fix included).

    Raises:
      ValueError: ``game.decoder`` preview modes without :attr:`TurnModel.preview`, or
        ``mllm.history_attention = "turn_window"`` without :attr:`TurnModel.kv_cache`.
    """
    decoder = str(config.game.get("decoder", "full"))
    if decoder != "full" and model.preview is None:
        raise ValueError(f"game.decoder={decoder!r} needs a system with a preview decoder; "
                         f"{model.label!r} has none. Fix: --config.game.decoder=full")
    if WindowSpec.from_config(config).history_attention == "turn_window" and model.kv_cache is None:
        raise ValueError(f"mllm.history_attention='turn_window' needs a system with a cached MLLM turn; "
                         f"{model.label!r} has none. Fix: play a real system (checkpoint or random "
                         f"init), or use --config.mllm.history_attention=window_recompute")


class RealTurnModel:
    """The real networks as a :class:`TurnModel`, their states the jit arguments.

    Args:
      components: loaded modules ``{"mllm": GameStateMLLM, "dit": CogVideoXDiT, "shot_encoder":
        ShotEncoder, "vae": VAE with ``decode(z)``}`` and optionally ``"reference"`` (phase r's
        adapter: :attr:`reference`, and :meth:`sample` takes ``reference=``), ``"characters"``
        (stored character LoRAs: :attr:`characters`) and ``"preview"`` (the preview decoder:
        :attr:`preview`); ``"dit"`` is the module clip_sampler.py's ``sampling_component`` names
        (the student for ``diffusion.sampler="student"``).
      config: the run config (``game.mode`` applied here).
      label, identity, description: as :class:`TurnModel`'s.
      decode_fn: optional ``(latents [B, T, C, h, w]) -> frames [B, T, 8h, 8w, 3]`` in [0, 1]
        replacing the VAE (tests of the other stages; no reference then); the label should say so.
    """

    def __init__(self, components: dict[str, Any], config, label: str, decode_fn=None, identity: str = "",
                 description: str = ""):
        config = apply_mode(config)
        self.label, self.identity, self.description = label, identity, description
        self.window = int(config.mllm.history_window)
        self.free_decoding = config.game.mode == "reference"
        self.max_new_tokens = int(config.game.get("reference_max_new_tokens", 200))
        # mllm.quantize (default "none"; reference mode: always "none"): weight-only int8 made here, at load
        self.mllm_graphdef, s_mllm = nnx.split(quantize_weights(components["mllm"], config.mllm.get("quantize", "none")))
        # prepared once here, not per denoising step: LoRA merged, weights in the activation dtype
        self.dit_graphdef, s_dit = nnx.split(dit_lib.prepare_for_inference(components["dit"]))
        uncond = components["shot_encoder"].uncond(1)[0].astype(jnp.float32)  # [Q, D] constant of E_a
        self.params: dict[str, Any] = {"mllm": s_mllm, "dit": s_dit, "uncond": uncond}
        self.streaming: ChunkedDecode | None = None  # chunked decode for streaming (untiled VAE only)
        self.decode_fn = decode_fn
        if decode_fn is None:
            self.vae_graphdef, self.params["vae"] = nnx.split(components["vae"])
            self._vae_decode, chunk, plan = vae_decoder(self.vae_graphdef, components["vae"].cfg, config)
            if chunk is not None:
                self.streaming = ChunkedDecode(plan, chunk)
        self.kv_cache: CachedMLLM | None = None
        if config.mllm.get("history_attention", "window_recompute") == "turn_window":
            self.kv_cache = CachedMLLM(self.mllm_graphdef, components["mllm"].cfg.llm, config)
        reference_graphdef = None
        self.reference: ReferenceEncoder | None = None
        if "reference" in components and decode_fn is None:  # phase r's adapter: --character works
            reference_graphdef, self.params["reference"] = nnx.split(components["reference"])
            self.latent_scale = float(config.vae.scaling_factor)
            self.reference = self._encode_reference
        self.characters: CharacterBank | None = None
        if "characters" in components:  # character LoRAs (python -m animegamer_jax.commands.character fit)
            chars = components["characters"]
            g_chars, self.params["characters"] = nnx.split(chars)
            self.characters = CharacterBank(tuple(chars.spec.names), self.dit_graphdef, g_chars)
        self.preview: PreviewDecoder | None = None
        if "preview" in components:  # phase preview's decoder: game.decoder=preview / preview_then_full
            self.preview_graphdef, self.params["preview"] = nnx.split(components["preview"])
            self.preview = self._preview
        self._sample = dit_sampler(self.dit_graphdef, config, reference_graphdef)

    def mllm(self, params, batch):
        """The MLLM turn (mllm_turn.py ``mllm_turn``): constrained state decoding, or the release's
        free decoding in ``reference`` mode (:attr:`free_decoding`)."""
        return mllm_turn(nnx.merge(self.mllm_graphdef, params["mllm"]), batch, self.window,
                         "free" if self.free_decoding else "constrained", self.max_new_tokens)

    def sample(self, params, rep, ml, keys, noise=None, reference=None):
        """The clip sampler (clip_sampler.py ``dit_sampler``: teacher with CFG, or the student)."""
        return self._sample(params, rep, ml, keys, noise, reference)

    def decode(self, params, latents):
        """The VAE decoder (vae_decode.py ``vae_decoder``), or ``decode_fn``."""
        if self.decode_fn is not None:
            return self.decode_fn(latents)
        return self._vae_decode(params, latents)

    def _encode_reference(self, params, images):
        return encode_reference(nnx.merge(self.vae_graphdef, params["vae"]), images, self.latent_scale)

    def _preview(self, params, latents):
        return media.to_unit(nnx.merge(self.preview_graphdef, params["preview"])(latents), media.VAE_RANGE)
