"""The real networks as a game system: GameStateMLLM -> CogVideoX DiT + DPM++ 2M (dynamic CFG) -> VAE.

Wraps loaded NNX modules (a system checkpoint's ``load_system``, game/loading.py) as a
:class:`~animegamer_jax.game.api.GameSystem` whose three functions take the modules' states as
jit arguments (weights are never baked in as constants):

* **MLLM** (docs/token_layout.md, models/mistral/mllm.py): the history query slots take the projected
  history representations (``embed_inputs``); pass B is one forward with the hybrid mask (+ the
  padding mask: sequences are right-padded to one length per game shape) and the representation is
  read at the engine's ``read_idx`` (the query positions, or the release's last 226 valid positions),
  then ``output_resampler``; pass A is the release's purely causal greedy decoding over the same
  embeddings, constrained to the state grammar (``AnimeGamerTokenizer.state_grammar``) and run with
  a KV cache inside one ``lax.scan``: prefill of the padded prompt, then one token per step at RoPE
  position ``last_idx + t`` with the padding keys masked, so each row decodes as if unpadded.
  States are read from the generated ids at positions 0, 3, 6, 9 (docs/token_layout.md#state-fields).
  With ``mllm.history_attention = "turn_window"`` the turn is :func:`mllm_turn_cached` instead: the
  game's KV cache is kept between turns (game/window.py ``CachePlan``, ``TurnKVCache``) and only the
  new tokens are prefilled, once for both passes (see there for what is shared).
  In ``reference`` mode pass A is the release's free greedy decoding (its logits processor, up to
  ``game.reference_max_new_tokens`` ids) and the states come from its text parser on the host
  (game/release_decoding.py; ``GameSystem.parse_states``).
* **Sampling** (docs/dit.md#conditioning-paths, docs/dit.md#motion-level-to-flow,
  docs/diffusion.md#sampler, docs/diffusion.md#guidance; diffusion/samplers.py): ML -> flow value
  (``dit.flow_table``), cond = s_a, uncond = E_a's unconditional embedding (shot_encoder.uncond,
  docs/encoders.md#unconditional-embedding) with the same flow, one CFG batch per step. The sampler
  is vmapped over games so each game's noise comes from its own key (``split(key)``: initial
  latents, SDE noise), which makes a game's output independent of the batch it is played in.
  Given noise replaces both draws: ``sample(..., noise={"initial": [B, T, C, h, w], "steps": [B, n,
  T, C, h, w]})`` (engine ``step(..., noise=...)``). In ``reference`` mode s_a is rounded to
  bfloat16 before the DiT, as the release does. :func:`dit_sampler` is this stage. With
  ``diffusion.sampler = "student"`` the DiT is the distilled student (checkpoint component
  ``student``, :func:`sampling_component`): ``num_sampling_steps`` calls, no CFG batch, the
  guidance scale ``diffusion.cfg_scale`` as its input (samplers.sample_student).
* **VAE** (docs/diffusion.md#latent-scale): ``decode(latents / scaling_factor)`` (spatially tiled
  when ``vae.tile_size`` > 0, or as the device's memory allows when -1) -> frames, mapped from
  [-1, 1] to [0, 1] and clipped (``video_io.to_unit``). Untiled, the system also has
  ``decode_chunk``: one chunk of the same causal chunk plan (``vae.decode_chunks``) per call, the
  cache carried by the caller, so a server can show the first frames while the rest decode.
  :func:`vae_decoder` is this stage.
"""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from animegamer_jax import mllm_tokenizer, parallel, video_io
from animegamer_jax.diffusion import samplers
from animegamer_jax.game import release_decoding
from animegamer_jax.game.api import GameSystem, apply_mode, flow_value
from animegamer_jax.game.window import CachePlan, TurnKVCache, WindowSpec
from animegamer_jax.models import attention
from animegamer_jax.models.cogvideox import dit as dit_lib
from animegamer_jax.models.cogvideox.vae_tiling import resolve_decode_tiling
from animegamer_jax.models.mistral import model as mistral
from animegamer_jax.models.mistral.mllm import hybrid_attention_mask

#: number of generated ids needed to read the four states (positions 0, 3, 6, 9)
STATE_TOKENS = 10


def _greedy_pass_a(llm, x: jax.Array, ids: jax.Array, last: jax.Array, num_tokens: int, pick) -> jax.Array:
    """Causal greedy decoding of ``num_tokens`` ids after each row's ``last`` position (pass A).

    One prefill of the right-padded prompt into a KV cache, then one token per ``lax.scan`` step at
    RoPE position ``last + t`` with the padding keys masked, so each row decodes as if unpadded.
    ``pick(t, logits [B, V] fp32, prev [B]) -> next ids [B]`` chooses each token.
    Returns int32 [B, num_tokens].
    """
    b, n = ids.shape
    cache = mistral.KVCache.init(llm.cfg, b, n + num_tokens - 1)
    out = llm(inputs_embeds=x, cache=cache, return_logits=False)
    h_last = jnp.take_along_axis(out.hidden, last[:, None, None], axis=1)
    logits = llm.logits(h_last)[:, 0].astype(jnp.float32)
    tok0 = pick(0, logits, jnp.take_along_axis(ids, last[:, None], axis=1)[:, 0]).astype(jnp.int32)
    k_pos = jnp.arange(n + num_tokens - 1)
    key_ok = (k_pos[None, :] <= last[:, None]) | (k_pos[None, :] >= n)  # drop the padding keys

    def step(carry, t):
        tok, cache = carry
        o = llm(tok[:, None], positions=(last + t)[:, None], cache=cache, padding_mask=key_ok)
        nxt = pick(t, o.logits[:, -1].astype(jnp.float32), tok).astype(jnp.int32)
        return (nxt, o.cache), nxt

    _, toks = jax.lax.scan(step, (tok0, out.cache), jnp.arange(1, num_tokens, dtype=jnp.int32))
    return jnp.concatenate([tok0[:, None], toks.T], axis=1)


def mllm_turn(mllm, batch: dict[str, jax.Array], window: int, decoding: str = "constrained",
              max_new_tokens: int = 200) -> tuple[jax.Array, jax.Array]:
    """One MLLM turn on a padded batch (see the module docstring).

    Args:
      mllm: a ``GameStateMLLM``.
      batch: ``game.window.stack_inputs`` arrays (ids, attention_mask, cmp_mask, gen_mask,
        hist_reps [B, W-1, Q, D], read_idx [B, Q], last_idx [B]).
      window: W (static); 1 means no history slots.
      decoding: ``"constrained"`` (state grammar, 10 ids, states read at positions 0, 3, 6, 9) or
        ``"free"`` (the release: ``max_new_tokens`` greedy ids after the release's logits processor,
        game/release_decoding.py; the caller parses them on the host with
        ``release_decoding.states_from_generated``).

    Returns:
      ``constrained``: (states int32 [B, 4] = ML, SC, ET, ST; rep float32 [B, Q, D]);
      ``free``: (generated ids int32 [B, max_new_tokens]; rep).
    """
    ids = batch["ids"]
    valid = batch["attention_mask"] != 0
    if window > 1:
        x = mllm.embed_inputs(ids, batch["cmp_mask"], batch["hist_reps"])
    else:
        x = mllm.embed_inputs(ids, None, None)
    # pass B: hybrid mask, representation at read_idx
    mask = hybrid_attention_mask(batch["gen_mask"], mllm.cfg.llm.window, valid)
    hidden = mllm.llm(inputs_embeds=x, attention_mask=mask, return_logits=False).hidden
    read = jnp.take_along_axis(hidden, batch["read_idx"][:, :, None], axis=1)
    rep = mllm.output_resampler(read).astype(jnp.float32)
    # pass A: causal greedy decoding with a KV cache
    llm = mllm.llm
    if decoding == "free":
        def pick_free(t, logits, prev):
            return jnp.argmax(release_decoding.video_token_logits(prev, logits), axis=-1)

        return _greedy_pass_a(llm, x, ids, batch["last_idx"], int(max_new_tokens), pick_free), rep
    if decoding != "constrained":
        raise ValueError(f"decoding must be 'constrained' or 'free', got {decoding!r}")
    grammar = mllm_tokenizer.AnimeGamerTokenizer.state_grammar()[:STATE_TOKENS]
    allowed = np.zeros((STATE_TOKENS, llm.cfg.vocab_size), bool)
    for t, ok in enumerate(grammar):
        allowed[t, list(ok)] = True
    allowed = jnp.asarray(allowed)

    def pick_constrained(t, logits, prev):
        return jnp.argmax(jnp.where(allowed[t], logits, -jnp.inf), axis=-1)

    toks = _greedy_pass_a(llm, x, ids, batch["last_idx"], STATE_TOKENS, pick_constrained)  # [B, 10]
    states = toks[:, jnp.array([0, 3, 6, 9])] - mllm_tokenizer.STRENGTH_BASE_ID + mllm_tokenizer.STRENGTH_MIN
    return states.astype(jnp.int32), rep


def _cached_forward(llm, cache: TurnKVCache, x, pos, turn, slots, new_valid, window: int, *,
                    block: tuple[jax.Array, jax.Array] | None = None, hide: jax.Array | None = None):
    """Writes N new tokens at ``slots`` and runs them against the whole cache.

    x [B, N, D] embeddings; pos, turn, slots int32 [B, N]; new_valid bool [B, N]; block
    (first, last) positions of the bidirectional query block [B] or None (purely causal); hide
    bool [S] slots hidden from this call (the other pass's scratch). Mask: causal + Mistral's
    sliding window + the turn window W (``AttentionMask.seg_window``, ``<s>`` a sink).
    Returns (hidden [B, N, D] post-norm, cache).
    """
    rows = jnp.arange(x.shape[0])[:, None]
    cache = cache.replace(k_pos=cache.k_pos.at[rows, slots].set(pos), k_turn=cache.k_turn.at[rows, slots].set(turn),
                          valid=cache.valid.at[rows, slots].set(new_valid))
    kv_valid = cache.valid if hide is None else cache.valid & ~hide[None]
    first, last = (None, None) if block is None else block
    mask = attention.causal_mask(llm.cfg.window, q_pos=pos, k_pos=cache.k_pos, kv_valid=kv_valid, block_first=first,
                            block_last=last, q_seg=turn, k_seg=cache.k_turn, seg_window=window)
    out = llm(inputs_embeds=x, positions=pos, attention_mask=mask, return_logits=False,
              cache=mistral.KVCache(cache.k, cache.v, jnp.zeros((), jnp.int32)), cache_slots=slots)
    return out.hidden, cache.replace(k=out.cache.k, v=out.cache.v)


def _scratch(plan: CachePlan, start: int, n: int) -> jax.Array:
    return jnp.zeros((plan.size,), bool).at[start:start + n].set(True)


def mllm_prefill_cached(mllm, cache: TurnKVCache, batch: dict[str, jax.Array], plan: CachePlan,
                        readout: str = "query") -> tuple[jax.Array, TurnKVCache]:
    """The shared prefill of a cached turn (also what rebuilds a cache by recompute).

    Writes the previous turn's history suffix (its s_a through ``input_resampler`` and its
    world ids), the current turn's prefix and its query block under the hybrid mask (pass B, in
    scratch B) in one forward over the cache; returns (s_a float32 [B, Q, D], cache). ``batch``:
    game/window.py ``stack_cached_inputs``. Scratch A (last turn's pass A) is emptied first.
    """
    q = plan.num_queries
    x = mllm.embed_inputs(batch["ids"], batch["cmp_mask"], batch["hist_rep"][:, None])
    cache = cache.replace(valid=cache.valid & ~_scratch(plan, plan.scratch_a, plan.block + plan.decode_tokens)[None])
    hidden, cache = _cached_forward(mllm.llm, cache, x, batch["positions"], batch["turn_ids"], batch["slots"],
                                    batch["valid"], plan.window, block=(batch["block_first"], batch["block_last"]))
    blk = hidden[:, -plan.block:]
    read = blk[:, :q] if readout == "query" else blk[:, plan.block - q:]
    return mllm.output_resampler(read).astype(jnp.float32), cache


def mllm_turn_cached(mllm, cache: TurnKVCache, batch: dict[str, jax.Array], plan: CachePlan,
                     readout: str = "query") -> tuple[jax.Array, jax.Array, TurnKVCache, jax.Array]:
    """One MLLM turn on the game's persistent cache (``history_attention = "turn_window"``).

    Shared by passes A and B (one prefill, :func:`mllm_prefill_cached`): everything before the
    current query block, i.e. the history turns (cached from earlier turns), the previous turn's
    suffix and the current prefix ``<TURN> text <img><frame>``: both passes see these tokens
    with the same causal (+ turn window) mask, so their keys/values are the same. Not shared:
    the query block and ``</frame></img><ML>``, which pass B sees bidirectionally (hybrid mask)
    and pass A causally, so from layer 1 on their keys differ; pass A recomputes these Q + 3
    tokens in scratch A (scratch B hidden from it), then decodes the ``plan.decode_tokens``
    state ids one per step, constrained to the state grammar.

    Args:
      mllm: a ``GameStateMLLM``; cache: :class:`TurnKVCache` of the game(s) (``CachePlan``
        slots); batch: game/window.py ``stack_cached_inputs``; readout: "query" | "last".

    Returns:
      (states int32 [B, 4], rep float32 [B, Q, D], cache, pass-A logits float32 [B, T, V]).
    """
    rep, cache = mllm_prefill_cached(mllm, cache, batch, plan, readout)
    llm = mllm.llm
    b, n = batch["ids"].shape
    nb = plan.block
    xa = mllm.embed_inputs(batch["ids"][:, n - nb:], None, None)  # the block holds no history slot
    pos_a, turn_a = batch["positions"][:, n - nb:], batch["turn_ids"][:, n - nb:]
    slots_a = jnp.broadcast_to(plan.scratch_a + jnp.arange(nb, dtype=jnp.int32), (b, nb))
    hide_b = _scratch(plan, plan.scratch_b, nb)
    hidden, cache = _cached_forward(llm, cache, xa, pos_a, turn_a, slots_a, jnp.ones((b, nb), bool), plan.window,
                                    hide=hide_b)
    grammar = mllm_tokenizer.AnimeGamerTokenizer.state_grammar()[:plan.decode_tokens]
    allowed = np.zeros((len(grammar), llm.cfg.vocab_size), bool)
    for t, ok in enumerate(grammar):
        allowed[t, list(ok)] = True
    allowed = jnp.asarray(allowed)

    def pick(t, logits):
        return jnp.argmax(jnp.where(allowed[t], logits, -jnp.inf), axis=-1).astype(jnp.int32)

    logits0 = llm.logits(hidden[:, -1:])[:, 0]
    tok0 = pick(0, logits0)
    cur = batch["turn"][:, None]

    def step(carry, t):
        tok, c = carry
        pos = (batch["ml_pos"] + t)[:, None]
        slot = jnp.broadcast_to(plan.scratch_a + nb + t - 1, (b, 1)).astype(jnp.int32)
        h, c = _cached_forward(llm, c, llm.embed(tok[:, None]), pos, cur, slot, jnp.ones((b, 1), bool),
                               plan.window, hide=hide_b)
        lg = llm.logits(h)[:, 0]
        nxt = pick(t, lg)
        return (nxt, c), (nxt, lg)

    (_, cache), (toks, lgs) = jax.lax.scan(step, (tok0, cache), jnp.arange(1, plan.decode_tokens, dtype=jnp.int32))
    toks = jnp.concatenate([tok0[:, None], toks.T], axis=1)
    logits = jnp.concatenate([logits0[:, None], jnp.moveaxis(lgs, 0, 1)], axis=1)
    states = toks[:, jnp.array([0, 3, 6, 9])] - mllm_tokenizer.STRENGTH_BASE_ID + mllm_tokenizer.STRENGTH_MIN
    return states.astype(jnp.int32), rep, cache, logits


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


def sampling_component(config) -> str:
    """The checkpoint component the clip sampler runs: ``"student"`` (phase d's distilled DiT) for
    ``diffusion.sampler = "student"``, else ``"dit"`` (the teacher)."""
    return "student" if str(config.diffusion.sampler) == samplers.STUDENT else "dit"


def build_real_system(components: dict[str, Any], config, label: str, decode_fn=None) -> GameSystem:
    """Wraps loaded modules as a :class:`GameSystem`.

    Args:
      components: ``{"mllm": GameStateMLLM, "dit": CogVideoXDiT, "shot_encoder": ShotEncoder,
        "vae": VAE with ``decode(z)``}``; ``"dit"`` is the module :func:`sampling_component` names
        (the student for ``diffusion.sampler="student"``).
      config: the run config with ``game.mode`` applied (:func:`~animegamer_jax.game.api.apply_mode`).
      label: shown in outputs.
      decode_fn: optional ``(latents [B, T, C, h, w]) -> frames [B, F, H, W, 3]`` in [0, 1]
        replacing the VAE (tests of the other stages); the label should say so.
    """
    config = apply_mode(config)
    window = int(config.mllm.history_window)
    reference_mode = config.game.mode == "reference"
    decoding = "free" if reference_mode else "constrained"
    max_new = int(config.game.get("reference_max_new_tokens", 200))
    g_mllm, s_mllm = nnx.split(components["mllm"])
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

    sample = dit_sampler(g_dit, config)
    parse = release_decoding.states_from_generated if decoding == "free" else None
    return GameSystem(params, mllm, sample, decode, label=label, decode_chunk=decode_chunk,
                      decode_plan=decode_plan, parse_states=parse, **cached)


def vae_spatial_shards(config, frame_hw: tuple[int, int], num_devices: int | None = None) -> int:
    """Devices one decoded frame ``[H, W]`` is split over by the config's mesh and rules (the VAE's
    ``act_height`` / ``act_width`` constraints; 8 in the latency layout on 8 devices, else 1)."""
    n = jax.device_count() if num_devices is None else int(num_devices)
    try:
        shape = parallel.resolve_mesh_shape(tuple(config.mesh.shape), n, tuple(config.mesh.axes))
    except parallel.ShardingConfigError:
        return 1
    mesh = SimpleNamespace(axis_names=tuple(config.mesh.axes), axis_sizes=shape)
    spec = parallel.logical_to_spec(("act_batch", "act_frames", "act_height", "act_width", "act_channels"),
                                    parallel.rules_from_config(config), shape=(1, 1, *frame_hw, 1), mesh=mesh)
    sizes = dict(zip(mesh.axis_names, shape))
    out = 1
    for entry in (spec[2], spec[3]):
        for a in ((entry,) if isinstance(entry, str) else (entry or ())):
            out *= sizes[a]
    return out


def vae_decoder(g_vae, vcfg, config, num_devices: int | None = None, device=None):
    """Play's VAE stage: ``(decode, decode_chunk, decode_plan)``.

    ``decode(p, latents [B, T, C, h, w] scaled) -> frames [B, F, H, W, 3]`` in [0, 1] with
    ``p["vae"]`` the VAE state: ``VAE_dec(latents / scaling_factor)``, tiled and chunked as
    ``vae_tiling.resolve_decode_tiling`` decides (``vae.tile_size`` -1: from the device's memory
    and the frame's shards on the mesh, :func:`vae_spatial_shards`). Untiled, ``decode_chunk(p,
    latents_chunk, cache) -> (frames, cache)`` runs one chunk of ``decode_plan`` (streaming);
    tiled, both are None / (). ``decode.why`` says what was chosen. ``num_devices``: the mesh's
    device count (default ``jax.device_count()``); ``device``: one device of that mesh, whose memory
    (or chip HBM, for compile-only devices) sets the tile budget (default ``jax.devices()[0]``). Used
    by :func:`build_real_system` and the ahead-of-time programs (animegamer_jax/aot).
    """
    scale = float(config.vae.scaling_factor)
    t, h, w = int(config.dit.num_latent_frames), int(config.dit.sample_height), int(config.dit.sample_width)
    sf = vcfg.spatial_factor
    shards = vae_spatial_shards(config, (sf * h, sf * w), num_devices)
    tile, plan, why = resolve_decode_tiling(vcfg, (t, h, w), shards=shards, device=device)
    logging.getLogger(__name__).info("VAE decode: %s", why)

    def decode(p, latents):
        vae = nnx.merge(g_vae, p["vae"])
        z = latents / scale
        video = vae.tiled_decode(z, tile_size=tile, plan=plan) if tile > 0 else vae.decode(z, plan)
        return _to_unit_frames(video, latents.shape)

    decode.why = why
    if tile > 0:
        return decode, None, ()

    def decode_chunk(p, latents, cache):
        # one step of CogVideoXVAE.decode's chunk loop (run_chunked), same plan and caches
        vae = nnx.merge(g_vae, p["vae"])
        z = jnp.moveaxis(latents / scale, 2, -1).astype(jnp.dtype(vae.cfg.dtype))
        video, cache = vae.decoder(z, cache)
        return _to_unit_frames(video.astype(jnp.float32), latents.shape), cache

    return decode, decode_chunk, tuple(plan)


def dit_sampler(g_dit, config):
    """The turn's DiT sampling as ``sample(p, rep [B, Q, D], ml int [B], keys [B, 2], noise=None)
    -> latents [B, T, C, h, w]`` with ``p = {"dit": DiT state, "uncond": [Q, D]}``: per game,
    initial noise from its key (or the given ``noise`` = {"initial", "steps"} per game, see
    samplers.sample's ``step_noise``), then the configured sampler with CFG, or the student's
    (``diffusion.sampler="student"``: ``p["dit"]`` the student's state, ``noise["steps"]`` its N
    re-noising draws, no CFG batch). In reference mode s_a
    is rounded to bfloat16 first, as the release does. The one clip sampler: play
    (:func:`build_real_system`), training's sample videos (train/samples.py), the decoder evaluation
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
    latent_shape = (config.dit.num_latent_frames, config.dit.in_channels, config.dit.sample_height,
                    config.dit.sample_width)

    def sample(p, rep, ml, keys, noise=None):
        dit = nnx.merge(g_dit, p["dit"])
        flow = flow_value(ml, table)
        if reference_mode:  # the release casts s_a to bfloat16 before the DiT (inference_Decoder.py)
            rep = rep.astype(jnp.bfloat16).astype(jnp.float32)

        def denoise(x, t, c):
            return dit(x, c["cond"], t, c["flow"], c.get("guidance"))

        def one(rep_b, flow_b, key_b, noise_b):
            k_init, k_sde = jax.random.split(key_b)
            if noise_b is None:
                x, steps = jax.random.normal(k_init, (1, *latent_shape), jnp.float32), None
            else:
                x, steps = noise_b["initial"][None], noise_b["steps"][:, None]
            cond = {"cond": rep_b[None], "flow": flow_b[None]}
            if student:
                cond["guidance"] = jnp.full((1,), w, jnp.float32)
                return samplers.sample_student(denoise, x, cond, k_sde, tau, schedule, step_noise=steps)[0]
            unc = {"cond": p["uncond"][None].astype(rep_b.dtype), "flow": flow_b[None]}
            return samplers.sample(denoise, x, cond, unc, k_sde, plan, step_noise=steps)[0]

        # games stay split over the data axes inside the vmap (also in the attention's shard_map)
        return parallel.vmap_over_batch(one, rep.shape[0])(rep, flow, keys, noise)

    return sample


def _to_unit_frames(video: jax.Array, latent_shape: tuple[int, ...]) -> jax.Array:
    """VAE output in [-1, 1] -> float32 [B, F, H, W, 3] in [0, 1] (docs/diffusion.md#latent-scale,
    ``video_io.to_unit``), accepting [B, F, H, W, 3] or the channels-first [B, 3, F, H, W] /
    [B, F, 3, H, W] layouts."""
    v = video.astype(jnp.float32)
    if v.ndim == 5 and v.shape[-1] != 3:
        v = jnp.moveaxis(v, 1 if v.shape[1] == 3 else 2, -1)
    return video_io.to_unit(v, video_io.VAE_RANGE)
