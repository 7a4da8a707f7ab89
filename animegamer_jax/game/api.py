"""The interface between the game engine and the systems it plays.

A system is a :class:`GameSystem`: three per-turn functions (MLLM, sampling, VAE) and their
parameters. The engine (game/engine.py) runs any system; the real networks are wrapped as one by
game/real_system.py, the random stand-in by game/standin_system.py. Both sides import only this
module, so neither imports the other.

Also here: the stage names (:data:`STAGES`) and one game's output for one turn (:class:`TurnResult`).
The frames' range is inference/vae_decode.py's ``FRAME_RANGE``, the ``game.mode`` rule
inference/mode.py's ``apply_mode``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

__all__ = ["STAGES", "GameSystem", "TurnResult"]

#: the three jitted stages of a turn, in order (timings and compile counts are keyed by these)
STAGES = ("mllm", "sampling", "vae")


@dataclasses.dataclass
class GameSystem:
    """The three per-turn functions of a playable system and their parameters.

    Attributes:
      params: pytree with the arrays each stage needs (``params["mllm"]``, ... or any layout
        the functions agree on); passed as a jit argument, never baked in as constants.
      mllm: ``(params, batch) -> (states int32 [B, 4], rep float32 [B, Q, rep_dim])``; ``batch`` is
        :func:`animegamer_jax.inference.turn_inputs.stack_inputs` output (ids, attention_mask, cmp_mask,
        gen_mask, hist_reps, hist_pos, hist_valid, read_idx, last_idx).
      sample: ``(params, rep [B, Q, rep_dim], ml int32 [B], keys uint32 [B, 2], noise=None[, reference=]) -> latents
        [B, t, C, h, w]``; row b must use only ``keys[b]`` for its noise, or, when ``noise`` is
        given, ``{"initial": [B, t, C, h, w], "steps": [B, num_steps, t, C, h, w]}`` (given noise).
      decode: ``(params, latents) -> frames float32 [B, T, 8h, 8w, 3]`` in inference/vae_decode.py's ``FRAME_RANGE``.
      label: what the system is (shown in outputs), e.g. ``"checkpoint /ckpt/system"``.
      description: what it was trained on and can show, from the checkpoint's manifest
        (``save_system(description=...)``); "" when it has none. Shown in game.json
        (``system_description``), the gallery, play's summary and the web app.
      parse_states: optional host function ``ids int [B, T] -> states int32 [B, 4]``; when set,
        ``mllm`` returns generated ids instead of states (reference mode's free decoding + the
        release's text parser, inference/release_decoding.py).
      decode_chunk: optional ``(params, latents_chunk [B, t, C, h, w], cache | None) ->
        (frames [B, f, H, W, 3], cache)``: one causal chunk of ``decode`` (the same chunk plan, so
        the frames match ``decode``'s), for showing frames as they are decoded (web server).
      decode_plan: the latent chunk sizes ``decode_chunk`` is run with (sum = t).
      identity: what the weights are, for output fingerprints (a checkpoint's content digest,
        ``checkpoint_identity``); empty = the label.
      mllm_cached: with ``mllm.history_attention = "turn_window"``: ``(params, cache, batch) ->
        (states int32 [B, 4], rep float32 [B, Q, rep_dim], cache)`` on the games' persistent KV cache
        (an inference/turn_inputs.py ``TurnKVCache``; batch = its ``stack_cached_inputs``).
      mllm_prefill: ``(params, cache, batch) -> cache``, the same turn's shared prefill only
        (rebuilding a cache by recompute); init_cache: ``batch -> empty cache``;
        cache_plan: the inference/turn_inputs.py ``CachePlan`` both use.
      encode_reference: a system that plays characters from a reference image (training phase r):
        ``(params, images uint8 [B, H, W, 3]) -> reference latents float32 [B, 1, C, h, w]``, and
        ``sample`` then takes ``reference=`` those latents (game/characters.py); None: no support.
      character_names: the names of the character LoRAs the system stores (component ``characters``,
        ``python -m animegamer_jax.commands.character fit``), in their order; () for none.
      apply_character: ``(dit params, index) -> dit params`` with stored character ``index``'s LoRA
        folded into the DiT's attention (``index`` static); ``sample`` with ``params["dit"]`` replaced
        by it plays a turn that names the character. None when ``character_names`` is empty.
      preview: a system with the preview decoder (training phase preview): ``(params, latents) ->
        frames`` like ``decode`` (same shape and range), from the small distilled decoder; played with
        ``game.decoder=preview`` or ``preview_then_full``; None: no preview.
    """

    params: Any
    mllm: Callable[..., tuple[jax.Array, jax.Array]]
    sample: Callable[..., jax.Array]
    decode: Callable[..., jax.Array]
    label: str
    parse_states: Callable[[np.ndarray], np.ndarray] | None = None
    decode_chunk: Callable[..., tuple[jax.Array, Any]] | None = None
    decode_plan: tuple[int, ...] = ()
    identity: str = ""
    description: str = ""
    mllm_cached: Callable[..., tuple[jax.Array, jax.Array, Any]] | None = None
    mllm_prefill: Callable[..., Any] | None = None
    init_cache: Callable[[int], Any] | None = None
    cache_plan: Any = None
    encode_reference: Callable[..., jax.Array] | None = None
    character_names: tuple[str, ...] = ()
    apply_character: Callable[..., Any] | None = None
    preview: Callable[..., jax.Array] | None = None


@dataclasses.dataclass
class TurnResult:
    """One game's output for one turn.

    Attributes:
      states: the predicted ``(ML, SC, ET, ST)``.
      rep: s_a, float32 ``[Q, rep_dim]``.
      frames: the clip, float32 ``[T, 8h, 8w, 3]`` in inference/vae_decode.py's ``FRAME_RANGE`` (or uint8 once converted).
      meters: ``{"social", "entertainment", "stamina"}`` after the turn.
    """

    states: tuple[int, int, int, int]
    rep: np.ndarray
    frames: np.ndarray
    meters: dict[str, int]
